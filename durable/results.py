"""Waiting for a run's end, from sync code (``result``) and from async code (``aresult``): one
``ResultWait`` reads the run and applies every rule, and each caller sleeps between looks in its
own way, woken early by the notice of the run's end where the database sends one."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from . import conf
from .annotated import shaped, signature
from .calls import FIRST_POLL, next_poll, run_id_of
from .definitions import registry
from .durations import parse_duration
from .errors import DurableError, InvalidInput, RunCancelled, RunFailed, WaitTimeout
from .statuses import TERMINAL, RunStatus
from .values import decode

if TYPE_CHECKING:
    from .models import Run

#: Seconds between two looks at a run whose end will be announced: only a lost notice waits this.
NOTIFIED_POLL = 1.0


def result(run_id: str, timeout: Any = None) -> Any:
    """Wait for the run to finish; return its output or raise RunFailed / RunCancelled / WaitTimeout."""
    wait = result_wait(run_id, timeout)
    notices = result_notices()
    pause = FIRST_POLL
    while True:
        announced = notices.subscribe(wait.run_id) if notices is not None and notices.live else None
        with announced or contextlib.nullcontext() as ended:
            left = wait.look()
            if wait.finished:
                return wait.output
            if wait.moved:
                continue  # the chain moved on: subscribe to its new last run, then look again
            if ended is not None:
                ended.wait(NOTIFIED_POLL if left is None else min(NOTIFIED_POLL, left))
                continue
            time.sleep(pause if left is None else min(pause, left))
            pause = next_poll(pause)


def result_notices() -> Any:
    """This process's listener for the notices of runs' ends, or None (polling only).

    Woken by the notice of the run's end where the database sends one; polling stays the
    fallback (a lost notice costs one NOTIFIED_POLL at most)."""
    from . import dispatch, waiting

    settings = conf.get()
    if not dispatch.transport.may_wait:
        return None
    return waiting.listener(settings.DATABASE, settings.LISTEN_DATABASE)


class ResultWait:
    """One caller's wait for a run's end (``result`` and ``aresult`` drive it): each ``look``
    reads the run once and says how long the caller may still wait, so sync and async callers
    share every rule and message."""

    def __init__(self, run_id: str, timeout: Any, limit: float | None) -> None:
        self.run_id, self.timeout, self.limit = run_id, timeout, limit
        self.started = time.monotonic()
        self.finished = False
        self.output: Any = None
        #: The last look found the chain moved on: subscribe to ``run_id`` anew, then look again.
        self.moved = False

    def look(self) -> float | None:
        """Read the run: set ``finished`` and ``output`` (or raise its failure, or WaitTimeout),
        else return the seconds left to wait (None: no limit)."""
        from . import dispatch
        from .engine import runs

        run = runs.ending(self.run_id)  # or the last run of a continue-as-new chain
        self.moved = run.id != self.run_id
        if self.moved:
            self.run_id = run.id
            return None
        if run.status in TERMINAL:
            self.output, self.finished = _outcome(run), True
            return None
        if not dispatch.transport.may_wait:
            raise WaitTimeout(
                f"run {self.run_id!r} is {run.status}, not finished; under durable_env call "
                "durable_env.run_until_idle() or advance_time() first",
                details={"status": run.status},
            )
        waited = time.monotonic() - self.started
        if self.limit is not None and waited >= self.limit:
            raise WaitTimeout(
                f"run {self.run_id!r} is still {run.status} after {_waited(self.timeout, self.limit)}",
                details={"status": run.status},
            )
        return None if self.limit is None else self.limit - waited


def _waited(timeout: Any, seconds: float) -> str:
    """The wait as the caller gave it, with a unit when it had none (``20`` → ``20 s``)."""
    return f"{seconds:g} s" if isinstance(timeout, int | float) else str(timeout)


def result_wait(run_id: str, timeout: Any) -> ResultWait:
    """Check ``result``'s arguments; the wait they describe."""
    from . import dispatch

    run_id_of(run_id)
    dispatch.hurry()  # the run waited for may be among the first turns this process holds
    try:
        limit = None if timeout is None else parse_duration(timeout, what="timeout").total_seconds()
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return ResultWait(run_id, timeout, limit)


def _outcome(run: Run) -> Any:
    if run.status == RunStatus.COMPLETED:
        return shaped(decode(run.output), _returns(run))
    error = run.error or {}
    if run.status == RunStatus.CANCELLED:
        raise RunCancelled(cause=error)
    raise RunFailed(cause=error, details=error.get("details"))


def _returns(run: Run) -> Any:
    """The return annotation of the workflow version ``run`` ran, when this process knows it."""
    try:
        return signature(registry.workflow(run.workflow, run.version).fn).returns
    except DurableError:  # a workflow this process does not know: its output as stored
        return None


async def aresult(run_id: str, timeout: Any = None) -> Any:
    """Await the run's end, as ``durable.result`` waits for it, without blocking the event loop.

    Each look is one short read in a thread; between looks the caller awaits the run's end
    notice (PostgreSQL) or sleeps with backoff, so the loop serves other requests meanwhile.
    """
    wait = await sync_to_async(result_wait)(run_id, timeout)
    notices = await sync_to_async(result_notices)()
    pause = FIRST_POLL
    while True:
        announced = notices.subscribe_async(wait.run_id) if notices is not None and notices.live else None
        with announced or contextlib.nullcontext() as ended:
            left = await sync_to_async(wait.look)()
            if wait.finished:
                return wait.output
            if wait.moved:
                continue
            if ended is not None:
                await ended.wait(NOTIFIED_POLL if left is None else min(NOTIFIED_POLL, left))
                continue
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = next_poll(pause)
