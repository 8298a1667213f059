"""First turns published behind the caller, in lots: a process that serves no queue (a web
process, a script, a shell) hands the wakes of the runs it starts to one thread of its own, which
publishes them: those started outside a transaction as they come, those started inside one as
its commit shared them out (``put_ready``).

The caller pays its commit and not a Celery publish (0.5 to 1 ms each), and a broker that is
slow or down stalls that thread, not the request. When starts come close together (a loop of
``durable.start()``: less than BURST_GAP apart on average) the thread lets up to BATCH gather
while they keep coming, LINGER at most, and sends them as one ``durable.advance_batch``: the
worker then takes one message where it took a message per run. A start on its own leaves at
once, and a caller that waits for a run (``durable.result``) cuts any lingering short (``hurry``).

Nothing here is needed for correctness: a run's first turn is a hint its ``wake_at`` backs up
(the timer sweep sends it again within ``RECONCILE_INTERVAL``), so a process killed before its
thread published loses no run. A process that exits normally waits for its thread (EXIT_WAIT at
most), so a script's last start leaves as it did before. A forked child starts with no thread
and nothing of its parent's to send.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("durable.dispatch")

#: Runs one message gathered here carries at most: small enough that a worker's processes still
#: take a burst's lots side by side, large enough that a loop of starts costs it few messages.
BATCH = 16
#: Longest a wake waits for others to gather, and only within a burst of starts.
LINGER = 0.015
#: Starts closer together than this on average make a burst.
BURST_GAP = 0.003
#: Seconds a process exiting normally waits for its thread to publish what it holds.
EXIT_WAIT = 5.0

Wake = tuple[str, str]  # (claiming queue, run id)
#: What the thread is handed: a wake to gather into a lot, or a message ready to leave as it is.
Item = Any


class Publisher:
    """One thread per process publishing the ``(queue, run_id)`` wakes handed to it, in lots.

    ``publish`` sends a lot and raises when the broker cannot take it. ``bind`` is called in the
    thread that hands over the first wake and returns what the publishing thread runs before its
    first publish (Celery's current app is per thread: the caller's must be the one used)."""

    def __init__(self, publish: Callable[[list[Item]], None], bind: Callable[[], Callable[[], None]]) -> None:
        self._publish, self._bind = publish, bind
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Condition()
        self._pending: list[Item] = []
        self._busy = self._hurried = False
        self._thread: threading.Thread | None = None
        self._last, self._gap = 0.0, 1.0

    def put(self, queue: str, run_id: str) -> None:
        """Publish the wake of ``run_id`` on ``queue`` soon, from this process's thread (from the
        caller's, when no thread can be started: the run is committed, so this never raises)."""
        self._hand_over([(queue, run_id)], ready=False)

    def put_ready(self, items: list[Item]) -> None:
        """Publish ``items`` (messages a commit shared out already) now, from the thread."""
        self._hand_over(items, ready=True)

    def _hand_over(self, items: list[Item], *, ready: bool) -> None:
        with self._lock:
            threaded = self._thread is not None or self._started()
            if threaded:
                self._pending.extend(items)
                if ready:
                    self._hurried = True
                else:
                    now = time.monotonic()
                    self._gap = 0.7 * self._gap + 0.3 * min(now - self._last, 1.0)
                    self._last = now
                self._lock.notify_all()
        if not threaded:
            self._send(items)

    def _started(self) -> bool:
        try:
            thread = threading.Thread(
                target=self._loop, args=(self._bind(),), name="durable-publisher", daemon=True
            )
            thread.start()
        except Exception:  # noqa: BLE001 - e.g. at interpreter shutdown: publish in the caller
            log.warning(
                "durable: no thread to publish first turns from; sending in the caller", exc_info=True
            )
            return False
        self._thread = thread
        return True

    def hurry(self) -> None:
        """Publish what is held now, without lingering for more."""
        with self._lock:
            if self._pending:
                self._hurried = True
                self._lock.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every wake handed over has been published (or failed); False on timeout."""
        self.hurry()
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _send(self, lot: list[Item]) -> None:
        try:
            self._publish(lot)
        except Exception:  # noqa: BLE001 - a wake is a hint: the timer sweep sends what did not leave
            log.warning(
                "durable: could not send %d first turn(s); a sweep will retry", len(lot), exc_info=True
            )

    def forked(self) -> None:
        """In a forked child: no thread, and nothing of the parent's to send (the parent sends it)."""
        self._reset()

    def _gather(self) -> None:
        """Within a burst, let the lot fill while starts keep coming: until it holds BATCH, the
        starts pause (none for BURST_GAP), a caller hurries it, or LINGER has passed."""
        deadline = time.monotonic() + LINGER
        while not self._hurried and len(self._pending) < BATCH:
            now = time.monotonic()
            wait = min(deadline - now, self._last + BURST_GAP - now)
            if wait <= 0:
                return
            self._lock.wait(wait)

    def _loop(self, bound: Callable[[], None]) -> None:
        try:
            bound()
        except Exception:  # noqa: BLE001 - publish with this thread's own app rather than not at all
            log.warning(
                "durable: the publishing thread could not take the caller's Celery app", exc_info=True
            )
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending)
                if self._gap < BURST_GAP:
                    self._gather()
                lot, self._pending = self._pending, []
                self._busy, self._hurried = True, False
            try:
                self._send(lot)
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()


def lots(run_ids: list[str]) -> list[list[str]]:
    """One queue's ``run_ids`` cut, in order, into lots of at most BATCH."""
    return [run_ids[i : i + BATCH] for i in range(0, len(run_ids), BATCH)]


_publishers: list[Publisher] = []


def publisher(publish: Callable[[list[Item]], None], bind: Callable[[], Callable[[], None]]) -> Publisher:
    """A publisher whose thread is reset in forked children and waited for at exit."""
    made = Publisher(publish, bind)
    _publishers.append(made)
    return made


def _at_exit() -> None:
    for made in _publishers:
        if not made.flush(EXIT_WAIT):
            log.warning("durable: exiting with first turns unsent; the timer sweep will send them")


def _after_fork() -> None:
    for made in _publishers:
        made.forked()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork)
