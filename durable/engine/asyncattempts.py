"""Dispatched ``async def`` attempts taken by a worker run side by side on its process's loop.

A Celery task is synchronous: a pool process runs one at a time. So ``durable.run_step`` for an
async step starts the coroutine on the loop and returns at once (its message is acknowledged like
any task's end), and the process takes the next message while the coroutine awaits. At most
``ASYNC_STEPS_PER_PROCESS`` attempts are in flight per process: past that, the task waits for a
slot before it returns, so the process takes no more messages (and the broker's prefetch, one
per pool process by default, holds at most that many more in the worker).

Each attempt stays held by this process (the lease keeper renews it) until its outcome is
written, from a small thread pool (the loop's thread never touches the database), by the same
code that writes a sync attempt's (``steps.record``). A process that dies with attempts in flight
loses nothing: their messages were acknowledged, but their holds lapse within a LEASE and the
sweep runs them again as lost attempts, each recorded once.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import asyncsteps, conf
from .. import connections as database
from ..definitions import Step
from ..errors import StepTimeout
from ..models import Checkpoint, Run
from ..models.result_and_turn import Held, RunAsTaken
from ..replay.attempt import LATER, begin_async, conclude
from ..replay.stepscope import StepInfo
from ..statuses import Attempted
from . import leases

if TYPE_CHECKING:
    from .attempts import Beats

log = logging.getLogger("durable.engine")

#: Set on a Celery worker (not a green pool, whose threads are greenlets): an async attempt
#: taken by a task runs detached from it. Elsewhere (the test harness, a turn running a step in
#: place) the calling thread waits for the coroutine.
detached = False

#: Threads per process that write outcomes, and that run the loop's sync calls (heartbeats).
#: Two: a second statement in flight while one waits on the database, without the process's
#: turns queueing behind more threads for the interpreter and the database (1,000 runs of one
#: one-second async step, a loop of starts, on two cores: about 3.1 s with four, 2.7 s with two,
#: 2.6 s with one, 3.3 s with eight).
WRITERS = 2
CALLERS = 2

_writer = threading.local()


def writing() -> bool:
    """Whether this thread writes an async attempt's outcome: the run's next turn may be
    replayed ahead here, but starts no step itself (an async one would wait for a slot on the
    thread that frees slots)."""
    return getattr(_writer, "active", False)


@dataclass(eq=False)
class _InFlight:
    attempt: asyncsteps.Attempt
    finish: Callable[[], None]
    run_id: str
    ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Process:
    """This process's slots, writer threads and attempts in flight (a forked child makes its own)."""

    def __init__(self, size: int) -> None:
        self.slots = threading.BoundedSemaphore(size)
        self.writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="durable-async-writer")
        # Apart from the writers: the loop waits for these, and must not wait behind outcomes.
        self.callers = ThreadPoolExecutor(CALLERS, thread_name_prefix="durable-async-caller")
        self.in_flight: set[_InFlight] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, name="durable-async-watch", daemon=True).start()

    def host(self, fn: Callable[[], Any]) -> Any:
        return self.callers.submit(_with_connection, fn).result()

    def _watch(self) -> None:
        # Once a CANCEL_CHECK for all of them: one query for the runs cancelled with
        # interrupt=True, and the attempts past their hard limit given up as timed out.
        while True:
            time.sleep(asyncsteps.CANCEL_CHECK)
            with self.lock:
                flying = list(self.in_flight)
            if not flying:
                continue
            for entry in flying:
                if entry.attempt.abandon_if_overdue():
                    self.writers.submit(entry.finish)
            try:
                self.writers.submit(_with_connection, functools.partial(_interrupt, flying)).result()
            except Exception:  # noqa: BLE001 - asked again at the next check
                log.warning("durable: could not check async attempts for cancels", exc_info=True)


_process: tuple[int, _Process] | None = None
_lock = threading.Lock()


def _here() -> _Process:
    global _process
    pid = os.getpid()
    with _lock:
        if _process is None or _process[0] != pid:
            _process = (pid, _Process(conf.get().ASYNC_STEPS_PER_PROCESS))
        return _process[1]


def _forked() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _with_connection(fn: Callable[[], Any]) -> Any:
    # A writer thread keeps its connection between jobs: drop it if broken or past CONN_MAX_AGE,
    # checked as at a task's start (a kept connection with nothing to read needs no ping).
    database.check_after_long_call()
    return fn()


def _interrupt(flying: list[_InFlight]) -> None:
    run_ids = {entry.run_id for entry in flying}
    db = conf.get().DATABASE
    cancelled = set(
        Run.objects.using(db)
        .filter(id__in=run_ids, cancel_request__interrupt=True)
        .values_list("id", flat=True)
    )
    for entry in flying:
        if entry.run_id in cancelled:
            entry.attempt.check_interrupted()


def launch(
    row: Checkpoint,
    step: Step,
    info: StepInfo,
    beats: Beats,
    began: float,
    read: RunAsTaken | None,
    holder: str,
    *,
    inline: bool = True,
) -> Attempted:
    """Start the attempt on the loop and return once it runs (after a slot freed, at the bound);
    its outcome is written when it ends, and the attempt let go then."""
    from . import steps  # it calls here: imported when first needed

    process = _here()
    process.slots.acquire()
    settings = conf.get()
    key = (row.run_id, row.seq, row.attempt)
    entry: _InFlight | None = None

    def finish() -> None:
        assert entry is not None
        with entry.lock:
            if entry.ended:
                return  # given up at its hard limit, then ended after all: written once
            entry.ended = True
        attempt = entry.attempt
        _writer.active = True
        try:
            _with_connection(lambda: _write(attempt))
        except Exception:  # noqa: BLE001 - the hold lapses: the attempt counts as lost, run again
            log.exception("durable: could not record async attempt %s#%s %s", *key)
        finally:
            _writer.active = False
            with process.lock:
                process.in_flight.discard(entry)
            leases.let_go_attempt(key)
            process.slots.release()

    def _write(attempt: asyncsteps.Attempt) -> None:
        output, error, retryable = conclude(
            step, info, attempt.outcome, timed_out=(StepTimeout,), max_bytes=settings.MAX_PAYLOAD_BYTES
        )
        if output is LATER:
            steps.await_completion(row, holder, beats)
        else:
            # A replay ahead at most on this thread: a whole turn (its local steps, say) would
            # hold a writer that other attempts' outcomes wait for.
            steps.record(row, step, output, error, retryable, beats, began, read=read, ahead_only=True)

    started = begin_async(
        step,
        info,
        row.input,
        beats,
        grace=settings.STEP_TIMEOUT_GRACE.total_seconds(),
        interrupted=beats.interrupted,
        host=process.host,
        max_bytes=settings.MAX_PAYLOAD_BYTES,
    )
    if not isinstance(started, asyncsteps.Attempt):  # it could not start: its outcome is known
        try:
            output, error, retryable = started
            return steps.record(row, step, output, error, retryable, beats, began, inline=inline, read=read)
        finally:
            leases.let_go_attempt(key)
            process.slots.release()
    entry = _InFlight(started, finish, row.run_id)
    with process.lock:
        process.in_flight.add(entry)
    started.future.add_done_callback(lambda _: process.writers.submit(finish))
    return Attempted.STARTED


def launch_held(
    run_id: str, seq: int, attempt: int, token: str | None, holder: str, held: Held | None = None
) -> None:
    """Start, once the write that took it commits, an attempt a turn took for this process;
    ``held``: the attempt and its run as that write read them back (else read after it)."""
    from . import steps

    assert token is not None  # every attempt sent or taken carries one
    start = functools.partial(steps.run_held, run_id, seq, attempt, token, holder, held)
    transaction.on_commit(start, using=conf.get().DATABASE)


def drain(timeout: float) -> None:
    """Wait up to ``timeout`` seconds for this process's attempts in flight (a worker leaving)."""
    current = _process
    if current is None or current[0] != os.getpid():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with current[1].lock:
            if not current[1].in_flight:
                return
        time.sleep(0.05)
