"""``async def`` steps: awaited on one event loop per process, under the step's time limits.

The loop runs ``run_forever`` in a daemon thread, started on first use and kept: an attempt
costs a task on it, not a loop of its own. It is keyed by the process id, so a pool child forked
after its parent started one starts its own (a loop's thread does not survive a fork).

The loop thread never touches the database (Django refuses the ORM in a thread running a loop,
and one slow query would stall every attempt on it): what the step calls synchronously, its
heartbeat's write, runs in the attempt's ``host`` thread, through ``Attempt.call``. When a thread
waits for the attempt (``Attempt.wait``: a task that runs it, a turn that runs it in place or
as a local step) it is that thread, so the write shares its connection and transaction.

Limits are kept on the loop, not by the thread watchdog of sync steps (it would raise into the
waiting thread, not the coroutine): at ``timeout`` (or ``heartbeat_timeout`` without a beat) the
task is cancelled and ``StepTimeout`` is raised at the coroutine's await point; an attempt still
running ``grace`` seconds later is abandoned as timed out (left to finish on the loop, unheard).
Cancelled because its run was (``interrupt=True``), the coroutine gets ``asyncio.CancelledError``
at its await point, and the attempt fails as a sync step's that raised ``StepCancelled``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import Future
from typing import Any

from .errors import StepCancelled, StepTimeout
from .steplimits import overrun, soft_limit

log = logging.getLogger("durable.steps")

#: How often an attempt asks whether its run was cancelled with interrupt=True.
CANCEL_CHECK = 1.0

_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn)


def loop() -> asyncio.AbstractEventLoop:
    """This process's loop for async steps, started on first use."""
    global _loop
    pid = os.getpid()
    current = _loop
    if current is not None and current[0] == pid:
        return current[1]
    with _lock:
        if _loop is not None and _loop[0] == pid:
            return _loop[1]
        new = _Loop()
        threading.Thread(target=new.run_forever, name="durable-async-steps", daemon=True).start()
        _loop = (pid, new)
        return new


def _forked() -> None:
    # A lock held by another thread at the fork stays held in the child, whose copy nobody releases.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _now() -> float:
    # Real time, as the sync steps' limits (freezegun fakes time.monotonic under tests).
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class _Loop(asyncio.SelectorEventLoop):
    """A loop on real time: a step's sleeps and limits are real whatever the engine's clock says
    (the test harness freezes it)."""

    def time(self) -> float:
        return _now()


class _Wake:
    """Put in an attempt's calls to wake the thread that waits for it."""


_WAKE = _Wake()


class Attempt:
    """One async attempt on the process loop.

    ``beat``: what ``durable.heartbeat()`` does for it (run by ``call``; it may raise
    ``StepCancelled``). ``interrupted``: asked every CANCEL_CHECK (in the host thread) whether the
    run was cancelled with interrupt=True. ``host``: runs a sync call for the loop and returns
    its result; None means the thread that calls ``wait``.
    """

    def __init__(
        self,
        what: str,
        *,
        timeout: float | None,
        heartbeat_timeout: float | None,
        grace: float,
        beat: Callable[[Any], None],
        interrupted: Callable[[], bool] | None = None,
        host: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self.what = what
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.grace = grace
        self._beat = beat
        self.interrupted = interrupted
        self._host = host
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._abandoned = False
        self._calls_lock = threading.Lock()
        self.future: Future[Any] = Future()
        self.began = self.last_beat = _now()
        #: Why the attempt was timed out, once it was; and when it is abandoned if still running.
        self.timed_out: str | None = None
        self.hard_at: float | None = None
        self.cancelled = False
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- from any thread --------------------------------------------------------------------

    def start(self, coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> None:
        """Schedule ``coro`` on the process loop, inside ``context`` (the step's scope)."""
        target = loop()
        target.call_soon_threadsafe(self._begin, target, coro, context)

    def beat(self, progress: Any = None) -> None:
        """``durable.heartbeat()`` inside the step: it moves a heartbeat_timeout on, and its write
        runs off the loop."""
        self.last_beat = _now()
        self.call(lambda: self._beat(progress))

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run in the host thread, for code on the loop (it blocks the loop meanwhile:
        keep it short)."""
        if self._host is not None:
            return self._host(fn)
        if threading.get_ident() == self._waiter:
            return fn()
        done: Future[Any] = Future()
        with self._calls_lock:
            if self._abandoned:
                raise StepTimeout(self.timed_out or f"{self.what} was abandoned")
            self._calls.put((fn, done))
        return done.result()

    def cancel(self, *, timed_out: str | None = None) -> None:
        """Cancel the coroutine: ``StepTimeout(timed_out)`` is raised at its await point when
        given, else ``asyncio.CancelledError``."""
        loop().call_soon_threadsafe(self._cancel, timed_out)

    def wait(self) -> Any:
        """Wait in this thread for the attempt's outcome (its return value, or what it raised),
        serving its sync calls meanwhile."""
        self._waiter = threading.get_ident()
        checked = _now()
        while not self.future.done():
            now = _now()
            until = min(
                checked + CANCEL_CHECK if self.interrupted else now + 3600, self.hard_at or now + 3600
            )
            try:
                item = self._calls.get(timeout=max(until - now, 0.001))
            except queue.Empty:
                item = None
            if isinstance(item, tuple):
                fn, done = item
                try:
                    done.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the coroutine that asked
                    done.set_exception(exc)
                continue
            now = _now()
            if self.hard_at is not None and now >= self.hard_at and not self.future.done():
                self._abandon()
                break
            if self.interrupted is not None and now >= checked + CANCEL_CHECK:
                checked = now
                self.check_interrupted()
        return self.outcome()

    def check_interrupted(self) -> None:
        if self.interrupted is not None and not self.cancelled and self.interrupted():
            self.cancel()

    def outcome(self) -> Any:
        """The attempt's return value, or raise what it ended with."""
        if self.hard_at is not None and not self.future.done():
            raise StepTimeout(f"{self.timed_out} and did not stop within {self.grace:g}s of it")
        try:
            return self.future.result()
        except asyncio.CancelledError:
            if self.timed_out is not None:
                raise StepTimeout(self.timed_out) from None
            raise StepCancelled(
                f"{self.what} was cancelled: its run was cancelled with interrupt=True"
            ) from None

    def abandon_if_overdue(self) -> bool:
        """Past its hard limit and still running: left to finish on the loop, unheard (True)."""
        if self.hard_at is None or self.future.done() or _now() < self.hard_at:
            return False
        self._abandon()
        return True

    def _abandon(self) -> None:
        with self._calls_lock:
            self._abandoned = True
        log.error(
            "durable: %s did not stop within STEP_TIMEOUT_GRACE of its limit; it is recorded as "
            "timed out and left running on the loop of process %s",
            self.what,
            os.getpid(),
        )
        while True:
            try:
                _, done = self._calls.get_nowait()
            except queue.Empty:
                return
            except (TypeError, ValueError):
                continue  # a wake
            done.set_exception(StepTimeout(self.timed_out or self.what))

    _waiter: int | None = None

    # -- on the loop ------------------------------------------------------------------------

    def _begin(
        self, target: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], context: contextvars.Context
    ) -> None:
        self._task = target.create_task(_drive(self, coro), context=context)
        self._task.add_done_callback(self._ended)
        self._arm(target)

    def _arm(self, target: asyncio.AbstractEventLoop) -> None:
        soft = self._soft_at()
        if soft is not None and self.timed_out is None:
            self._timer = target.call_at(soft, self._tick, target)

    def _tick(self, target: asyncio.AbstractEventLoop) -> None:
        soft = self._soft_at()
        if soft is None or self._task is None or self._task.done():
            return
        if _now() < soft:
            self._arm(target)  # a beat moved the limit on
            return
        self._cancel(self._why())

    def _cancel(self, timed_out: str | None) -> None:
        if self._task is None or self._task.done() or self.timed_out is not None or self.cancelled:
            return
        if timed_out is not None:
            self.timed_out = timed_out
            self.hard_at = _now() + self.grace
        else:
            self.cancelled = True
        self._task.cancel()
        self._calls.put(_WAKE)  # the waiter now watches the hard limit

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if task.cancelled():
            self.future.set_exception(asyncio.CancelledError())
        elif task.exception() is not None:
            self.future.set_exception(task.exception())
        else:
            self.future.set_result(task.result())
        self._calls.put(_WAKE)

    def _soft_at(self) -> float | None:
        return soft_limit(self.began, self.timeout, self.last_beat, self.heartbeat_timeout)

    def _why(self) -> str:
        return overrun(self.what, self.began, self.timeout, self.last_beat, self.heartbeat_timeout)


async def _drive(attempt: Attempt, coro: Coroutine[Any, Any, Any]) -> Any:
    return await _Translated(attempt, coro)


class _Translated:
    """Awaits ``coro`` as ``await coro`` would, except that the cancel of a timeout reaches it as
    ``StepTimeout``: the step's ``except StepTimeout`` and ``finally`` run as in a sync step."""

    def __init__(self, attempt: Attempt, coro: Coroutine[Any, Any, Any]) -> None:
        self.attempt = attempt
        self.coro = coro

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self.coro
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                if thrown is not None:
                    raising, thrown = thrown, None
                    yielded = coro.throw(raising)
                else:
                    yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value
            try:
                sent = yield yielded
            except asyncio.CancelledError as exc:
                why = self.attempt.timed_out
                thrown = exc if why is None else StepTimeout(why)
            except BaseException as exc:  # noqa: BLE001 - passed on to the step, as await would
                thrown = exc
