"""Waking a caller that waits for a run to end: PostgreSQL notifies, received by one listening
connection per process, with the caller's own polling as the fallback.

The transaction that ends a run sends ``NOTIFY`` (a trigger, migration 0014); PostgreSQL
delivers it when that transaction commits. Here one daemon thread holds a connection that
``LISTEN``s and sets the event of every caller waiting for that run. A notification that is lost
(the listener reconnecting) costs the caller one poll interval; without a listener (another
database, psycopg 2 or 3.1) callers poll.
A caller on an event loop (``durable.aresult``) subscribes an awaitable event instead: the
listener thread sets it through the loop, so no thread is parked for the caller's wait.

A pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) hands the connection that
ran ``LISTEN`` to other clients between statements, so its notices never reach the listener. The
listener finds out at once: it sends itself a probe through a second connection and, unheard
within ``PROBE_WAIT``, says so once and stands down; callers then poll as on SQLite, and the
listener tries again after ``DEAF_FOR``. ``DURABLE["LISTEN_DATABASE"]`` names a database alias that
reaches PostgreSQL directly (or through the pooler in session mode) for the listener alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from django.db import connections

from .models.runs import RUN_ENDED

log = logging.getLogger("durable.waiting")

#: Seconds a broken listener waits before it connects again; callers poll meanwhile.
RECONNECT_AFTER = 5.0
#: Seconds a listener no one waits on keeps its connection; the next wait opens a new one.
IDLE_AFTER = 60.0
#: Seconds a new listener waits to hear the probe it sent itself before it counts as deaf.
PROBE_WAIT = 2.0
#: Seconds a deaf listener's process polls before it tries listening again.
DEAF_FOR = 600.0
#: The start of a probe's payload: no run id begins so, so no caller is woken by one.
PROBE = "durable-probe:"


class Waker(Protocol):
    """What the listener sets when a run is announced: a ``threading.Event`` or a ``LoopEvent``."""

    def set(self) -> None: ...


class LoopEvent:
    """An ``asyncio.Event`` that the listener thread may set: the set runs on the event's loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def set(self) -> None:
        # A loop that closed meanwhile has no one left to wake.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.event.set)

    async def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the set; whether it came."""
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
        except TimeoutError:
            return False
        return True


class Listener:
    """One LISTEN connection of this process, and the callers waiting on it, by run id.

    ``alias``: the database the connection listens on; ``runs_alias``: the one whose writes end
    runs (the probe is sent there, so a listener on another database never counts as live)."""

    def __init__(self, alias: str, runs_alias: str) -> None:
        self.alias = alias
        self.runs_alias = runs_alias
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.waiting: dict[str, set[Waker]] = {}
        self.listening = threading.Event()
        self.stopped = threading.Event()
        #: Set once the first LISTEN is known to work or not (``deaf_since``).
        self.settled = threading.Event()
        self.deaf_since: float | None = None
        self.probe = f"{PROBE}{uuid.uuid4().hex}"
        self.idle_since = time.monotonic()
        self.thread = threading.Thread(target=self._listen, name="durable-result-listener", daemon=True)
        self.thread.start()
        # Callers read the run only once LISTEN is in place, so no end can slip between the two.
        self.settled.wait(5 + PROBE_WAIT)

    def subscribe(self, run_id: str) -> contextlib.AbstractContextManager[threading.Event]:
        """An event set when ``run_id`` is announced as ended (subscribe before reading the run)."""
        return self._subscribed(run_id, threading.Event())

    def subscribe_async(self, run_id: str) -> contextlib.AbstractContextManager[LoopEvent]:
        """As ``subscribe``, for a caller on the running event loop: the event is awaited."""
        return self._subscribed(run_id, LoopEvent())

    @contextmanager
    def _subscribed(self, run_id: str, event: Any) -> Iterator[Any]:
        with self.lock:
            self.waiting.setdefault(run_id, set()).add(event)
            self.idle_since = time.monotonic()
        try:
            yield event
        finally:
            with self.lock:
                events = self.waiting.get(run_id, set())
                events.discard(event)
                if not events:
                    self.waiting.pop(run_id, None)
                self.idle_since = time.monotonic()

    @property
    def live(self) -> bool:
        return self.listening.is_set() and not self.stopped.is_set()

    def stop(self) -> None:
        """Close the connection (within a second) and let the callers poll."""
        self.stopped.set()
        self.thread.join(5)

    def _idle(self) -> bool:
        with self.lock:
            return not self.waiting and time.monotonic() - self.idle_since > IDLE_AFTER

    def _listen(self) -> None:
        while not self.stopped.is_set():
            try:
                with self._connect(self.alias) as conn:
                    conn.execute(f"LISTEN {RUN_ENDED}")
                    if not self._hears_itself(conn):
                        self._stand_down()
                        return
                    self.listening.set()
                    self.settled.set()
                    while not self.stopped.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            self._wake(notice.payload)
                        if self._idle():
                            self.stopped.set()  # an idle process holds no connection
            except Exception:  # noqa: BLE001 - callers poll until the listener is back
                log.warning("durable: the result listener lost its connection; callers poll", exc_info=True)
            self.settled.set()
            self.listening.clear()
            # Whoever waits now may have missed a notice: wake them all to look again.
            with self.lock:
                for events in self.waiting.values():
                    for event in events:
                        event.set()
            self.stopped.wait(RECONNECT_AFTER)

    def _hears_itself(self, conn: Any) -> bool:
        """Whether a notice sent on another connection reaches this one (not behind a pooler in
        transaction mode, where the session that ran LISTEN is another client's meanwhile)."""
        with self._connect(self.runs_alias) as sender:
            sender.execute("SELECT pg_notify(%s, %s)", (RUN_ENDED, self.probe))
        deadline = time.monotonic() + PROBE_WAIT
        while (left := deadline - time.monotonic()) > 0:
            for notice in conn.notifies(timeout=left, stop_after=1):
                if notice.payload == self.probe:
                    return True
                self._wake(notice.payload)
        return False

    def _stand_down(self) -> None:
        self.deaf_since = time.monotonic()
        log.warning(
            "durable: a notice sent on database %r did not reach the connection listening on %r "
            "(a pooler in transaction mode, or two different databases?): durable.result() polls "
            'instead. Set DURABLE["LISTEN_DATABASE"] to an alias that reaches the same PostgreSQL '
            "database directly, or through the pooler in session mode",
            self.runs_alias,
            self.alias,
        )
        self.stopped.set()
        self.settled.set()

    @staticmethod
    def _connect(alias: str) -> Any:
        wrapper = connections[alias]
        conn = wrapper.Database.connect(**wrapper.get_connection_params())
        conn.autocommit = True
        return conn

    def _wake(self, run_id: str) -> None:
        with self.lock:
            for event in self.waiting.get(run_id, ()):
                event.set()


_listeners: dict[str, Listener] = {}
_guard = threading.Lock()


def listener(runs_alias: str, alias: str | None = None) -> Listener | None:
    """This process's listener for the ends of runs written on database ``runs_alias``, on a
    connection of ``alias`` (the same by default); None where runs are not announced (not
    PostgreSQL with psycopg 3.2 or later), or while it cannot listen."""
    alias = alias or runs_alias
    wrapper = connections[alias]
    if connections[runs_alias].vendor != "postgresql" or wrapper.vendor != "postgresql":
        return None
    if not _waits_for_notices(wrapper.Database):
        return None
    with _guard:
        found = _listeners.get(alias)
        if found is not None and found.pid == os.getpid() and _deaf(found):
            return None
        # A forked child starts its own; an idle one that closed is replaced.
        if found is None or found.pid != os.getpid() or found.stopped.is_set():
            found = _listeners[alias] = Listener(alias, runs_alias)
    return found if found.live else None


def _waits_for_notices(driver: Any) -> bool:
    """psycopg 3.2 or later: its ``notifies()`` waits with a timeout (3.1's blocks for good)."""
    if driver.__name__ != "psycopg":
        return False
    major, minor = (int(part) for part in driver.__version__.split(".")[:2])
    return (major, minor) >= (3, 2)


def _deaf(found: Listener) -> bool:
    """Whether ``found`` heard no probe within the last ``DEAF_FOR``: not worth a new try yet."""
    return found.deaf_since is not None and time.monotonic() - found.deaf_since < DEAF_FOR


def stop_all() -> None:
    """Close every listener of this process (say before a test database is dropped)."""
    with _guard:
        found = [one for one in _listeners.values() if one.pid == os.getpid()]
        _listeners.clear()
    for one in found:
        one.stop()
