"""Step time limits, enforced in the process that runs the step, eager or dispatched alike.

At the soft limit (``timeout``, or ``heartbeat_timeout`` without a beat) ``StepTimeout`` is raised
inside the step: by SIGALRM (``signal.setitimer``) when the step runs in the main thread, which
also cuts a blocking call short; in any other thread (Celery's threads pool) the watchdog thread
raises it asynchronously, delivered at the step's next bytecode (a thread blocked in C code gets
it when the call returns). At the hard limit (the soft one plus STEP_TIMEOUT_GRACE) the watchdog
records the attempt's outcome ``timeout`` first, then, in a Celery prefork child, ends the process
(``os._exit``: the pool starts a fresh one), so the run goes on at once instead of after a LEASE.
A process that may not exit (solo or threads pool, tests) logs the stuck thread instead.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import StepTimeout
from ..steplimits import overrun, soft_limit
from . import leases

log = logging.getLogger("durable.engine")


@dataclass(eq=False)
class Limit:
    """The limits of one running attempt (monotonic seconds)."""

    what: str
    thread: int
    timeout: float | None
    heartbeat_timeout: float | None
    grace: float
    #: Records the attempt as timed out; True when that write won.
    on_hard: Callable[[str], bool]
    began: float
    last_beat: float
    by_signal: bool = False
    soft_sent: bool = False
    ended: bool = False

    def soft_at(self) -> float:
        soft = soft_limit(self.began, self.timeout, self.last_beat, self.heartbeat_timeout)
        assert soft is not None  # a limit is made only for a step that has one
        return soft

    def hard_at(self) -> float:
        return self.soft_at() + self.grace

    def why(self) -> str:
        return overrun(self.what, self.began, self.timeout, self.last_beat, self.heartbeat_timeout)


def _now() -> float:
    # The kernel's monotonic clock, read directly: freezegun fakes time.monotonic under tests,
    # and a step's limit is real time whatever the engine's clock says.
    return time.clock_gettime(time.CLOCK_MONOTONIC)


_cond = threading.Condition()
_limits: list[Limit] = []
_watchdog_pid: int | None = None
#: The limit armed on SIGALRM in this process's main thread (one step runs there at a time).
_armed: Limit | None = None
_previous: Any = None


class Guard:
    """The limits of one attempt, enforced while the step's code runs inside ``with guard:``;
    ``beat()`` (called on each ``durable.heartbeat()``) moves a heartbeat_timeout on."""

    def __init__(
        self,
        what: str,
        timeout: timedelta | None,
        heartbeat_timeout: timedelta | None,
        grace: timedelta,
        on_hard: Callable[[str], bool],
    ) -> None:
        self.limit: Limit | None = None
        if timeout is not None or heartbeat_timeout is not None:
            self.limit = Limit(
                what,
                0,
                None if timeout is None else timeout.total_seconds(),
                None if heartbeat_timeout is None else heartbeat_timeout.total_seconds(),
                grace.total_seconds(),
                on_hard,
                0.0,
                0.0,
            )

    def __enter__(self) -> Guard:
        limit = self.limit
        if limit is None:
            return self
        limit.thread = threading.get_ident()
        limit.began = limit.last_beat = _now()
        limit.by_signal = _arm(limit)
        with _cond:
            _limits.append(limit)
            _cond.notify()
        _ensure_watchdog()
        return self

    def __exit__(self, *exc: object) -> None:
        limit = self.limit
        if limit is None:
            return
        # First: nothing may be raised into the code that records the result.
        if limit.by_signal:
            _disarm()
        with _cond:
            limit.ended = True
            if limit in _limits:
                _limits.remove(limit)
        if limit.soft_sent and not limit.by_signal:
            _raise_in(limit.thread, None)  # an async StepTimeout not delivered yet is dropped

    def beat(self) -> None:
        limit = self.limit
        if limit is None or limit.ended:
            return
        limit.last_beat = _now()
        if limit.heartbeat_timeout is not None and limit.by_signal and not limit.soft_sent:
            signal.setitimer(signal.ITIMER_REAL, max(limit.soft_at() - _now(), 0.001))
        with _cond:
            _cond.notify()


# -- the soft limit by SIGALRM ---------------------------------------------------------------


def _arm(limit: Limit) -> bool:
    """Arm SIGALRM for ``limit`` when this is the main thread and nobody else uses the signal."""
    global _armed
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return False
    if signal.getitimer(signal.ITIMER_REAL)[0] or signal.getsignal(signal.SIGALRM) not in (
        signal.SIG_DFL,
        signal.SIG_IGN,
        None,
        _on_alarm,
    ):
        return False  # the project times something with SIGALRM itself: the watchdog does it
    global _previous
    _armed = limit
    _previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(limit.soft_at() - _now(), 0.001))
    return True


def _disarm() -> None:
    global _armed
    signal.setitimer(signal.ITIMER_REAL, 0)
    _armed = None
    signal.signal(signal.SIGALRM, _previous if _previous is not None else signal.SIG_DFL)


def _on_alarm(signum: int, frame: object) -> None:
    limit = _armed
    if limit is None or limit.ended or limit.soft_sent:
        return
    left = limit.soft_at() - _now()
    if left > 0.0005:  # a beat moved the limit on since the timer was set
        signal.setitimer(signal.ITIMER_REAL, left)
        return
    limit.soft_sent = True
    raise StepTimeout(limit.why())


# -- the watchdog -----------------------------------------------------------------------------


def _ensure_watchdog() -> None:
    # One thread per process; a forked pool child starts its own.
    global _watchdog_pid
    if _watchdog_pid == os.getpid():
        return
    with _cond:
        if _watchdog_pid == os.getpid():
            return
        _watchdog_pid = os.getpid()
    threading.Thread(target=_watch_forever, name="durable-step-limits", daemon=True).start()


def _watch_forever() -> None:
    while True:
        with _cond:
            now = _now()
            due = [limit for limit in _limits if _next_at(limit) <= now]
            if not due:
                nearest = min((_next_at(limit) for limit in _limits), default=None)
                _cond.wait(None if nearest is None else max(nearest - now, 0.001))
                continue
        for limit in due:
            _act(limit)


def _next_at(limit: Limit) -> float:
    if not limit.soft_sent and not limit.by_signal:
        return limit.soft_at()
    return limit.hard_at()


def _act(limit: Limit) -> None:
    now = _now()
    with _cond:
        if limit.ended:
            return
        if not limit.soft_sent and not limit.by_signal and now >= limit.soft_at() and now < limit.hard_at():
            limit.soft_sent = True
            _raise_in(limit.thread, StepTimeout)
            return
        _limits.remove(limit)  # the hard limit: acted on once
    why = limit.why()
    try:
        recorded = limit.on_hard(f"{why} and did not stop within {limit.grace:g}s of it")
    except Exception:  # noqa: BLE001 - the attempt's hold lapses instead, within a LEASE
        log.warning("durable: could not record the timeout of %s", limit.what, exc_info=True)
        recorded = False
    with _cond:
        still_running = not limit.ended
    if not still_running:
        return
    if leases.may_exit:
        log.error(
            "durable: %s did not stop within STEP_TIMEOUT_GRACE of its limit; its outcome is %s, "
            "ending this pool process (pid %s) so the pool starts a fresh one",
            limit.what,
            "recorded as timeout" if recorded else "settled already",
            os.getpid(),
        )
        os._exit(1)
    log.error(
        "durable: %s did not stop within STEP_TIMEOUT_GRACE of its limit and still holds thread %s "
        "of process %s (not a prefork pool child, so it is not ended); its outcome is %s",
        limit.what,
        limit.thread,
        os.getpid(),
        "recorded as timeout" if recorded else "settled already",
    )


def _raise_in(thread: int, exc: type[BaseException] | None) -> None:
    # None clears a pending exception; ctypes passes None as NULL.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc) if exc else None)
