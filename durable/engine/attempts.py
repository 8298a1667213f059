"""Execute one step attempt in this process: the step scope, its heartbeats, and whether a
dispatched step may run here, inside the turn that reached it, instead of crossing the broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connections as databases
from django.db import transaction

from .. import asyncsteps, clock, conf, connections, dispatch
from ..definitions import Step
from ..errors import StepCancelled, StepTimeout, step_timeout_error
from ..models import Checkpoint, Run
from ..replay.attempt import Result, beat_grace, run_attempt
from ..replay.history import Record
from ..replay.stepscope import StepInfo
from ..statuses import FlowState
from ..values import json_value
from . import asyncattempts, behind, flow, leases, timelimits

log = logging.getLogger("durable.engine")


def reads_run_with_take(settings: conf.Settings) -> bool:
    """Whether this process reads the run with each take of an attempt (``result_and_turn``): a
    worker that runs a run's next turn itself, on PostgreSQL (the fence is the row's version there)."""
    served = dispatch.transport.served_queues  # None: every queue (the test harness)
    return (
        settings.INLINE_NEXT_TURN and served != set() and databases[settings.DATABASE].vendor == "postgresql"
    )


def serves(queue: str) -> bool:
    """Whether this process consumes ``queue`` (the harness consumes every queue)."""
    return dispatch.transport.serves(queue)


class Limited:
    """Runs an attempt inside the turn that reached it, under the turn's lease and the step's own
    time limits, enforced here as on a worker of its queue (``timelimits``); at the hard one the
    attempt is recorded as timed out and the run handed back before the process ends, so another
    worker goes on at once. As such it runs a ``local=True`` step that has a time limit."""

    def __init__(self, run_id: str, owner: str, queue: str, settings: conf.Settings) -> None:
        self.run_id = run_id
        self.owner = owner
        self.queue = queue
        self.settings = settings

    def __call__(self, rec: Record, step: Step) -> Result:
        behind.let_go()  # the body may run long: the turns behind this one go on without it
        beats = Beats(self.run_id, rec.seq, rec.attempt, self.settings, step.heartbeat_timeout)
        with leases.unwatched(self.run_id):
            info = StepInfo(self.run_id, rec.seq, rec.attempt, step.name, secret=rec.token)
            result = execute(step, info, rec.input, beats, self._timed_out(rec, step))
        beats.keep_last(Checkpoint.objects.using(self.settings.DATABASE))
        return result

    def _timed_out(self, rec: Record, step: Step) -> Callable[[str], bool]:
        """What the watchdog does at the step's hard limit: record the attempt as timed out and
        hand the run back (its turn, stuck in the step, could write nothing more anyway)."""
        run_id, seq, attempt = self.run_id, rec.seq, rec.attempt
        db = self.settings.DATABASE

        def record(why: str) -> bool:
            now = clock.now()
            error = step_timeout_error(why)
            checkpoints = Checkpoint.objects.using(db)
            with transaction.atomic(using=db):
                if step.retry.allows_after(attempt):
                    done = checkpoints.retry_at(run_id, seq, attempt, error, now + step.retry.delay(attempt))
                else:
                    done = checkpoints.fail(run_id, seq, attempt, error, now)
                if done and Run.objects.using(db).release(run_id, self.owner, now, now):
                    dispatch.advance(run_id, self.queue)
                if done and rec.flow == FlowState.HELD and rec.flow_key:
                    flow.hand_off(rec.flow_key)  # after the run's row, as gates always come
            return done

        return record


class InPlace(Limited):
    """Runs a dispatched step inside the turn that reached it, under the turn's lease.

    Offered only on a worker that consumes the step's queue (never under the test harness, whose
    messages stay visible), when EAGER_STEPS is on and no Celery time limit would cut the turn.
    """

    @classmethod
    def offered(cls, run_id: str, owner: str, queue: str, settings: conf.Settings) -> InPlace | None:
        if (
            not settings.EAGER_STEPS
            or asyncattempts.writing()
            or not dispatch.transport.served_queues
            or dispatch.time_limit() is not None
        ):
            return None
        return cls(run_id, owner, queue, settings)

    def accepts(self, queue: str, step: Step) -> bool:
        if asyncattempts.detached and asyncsteps.is_async(step.fn):
            # Sent instead: a worker runs many async attempts at once on its loop, where one run
            # here would hold this process for its whole wait.
            return False
        return queue in (dispatch.transport.served_queues or ())

    def holder(self, queue: str, step: Step) -> str | None:
        if (
            asyncattempts.detached
            and asyncsteps.is_async(step.fn)
            and queue in (dispatch.transport.served_queues or ())
        ):
            # Started on this process's loop once the turn commits: no message, no take of its own.
            return leases.process_holder()
        return None


def execute(
    step: Step,
    info: StepInfo,
    payload: Any,
    beats: Beats,
    on_hard_limit: Callable[[str], bool] | None = None,
) -> Result:
    """Run the attempt's body in this process under the step's time limits: at the soft one
    ``StepTimeout`` is raised inside it (as is Celery's soft limit, for a project that sets one),
    at the hard one ``on_hard_limit`` records the timeout and the process ends."""
    settings = conf.get()
    guard = timelimits.Guard(
        f"step {step.name!r} attempt {info.attempt} of run {info.run_id}",
        step.timeout,
        step.heartbeat_timeout,
        settings.STEP_TIMEOUT_GRACE,
        on_hard_limit or _not_recorded,
    )

    def beat(progress: Any) -> None:
        guard.beat()
        beats(progress)

    result = run_attempt(
        step,
        info,
        payload,
        beat,
        timed_out=(StepTimeout, *dispatch.SOFT_TIME_LIMIT_ERRORS),
        max_bytes=settings.MAX_PAYLOAD_BYTES,
        guard=guard,
        grace=settings.STEP_TIMEOUT_GRACE.total_seconds(),
        interrupted=beats.interrupted,
    )
    connections.check_after_long_call()
    return result


def _not_recorded(why: str) -> bool:
    return False


#: How often a heartbeating step asks whether its run was cancelled with interrupt=True.
CANCEL_CHECK = timedelta(seconds=1)


class Beats:
    """``durable.heartbeat()`` for a dispatched step: persist at most once per throttle window
    (for a step with a ``heartbeat_timeout``, at most once per ``beat_grace``, so the judge of its
    liveness never waits out the throttle), and raise ``StepCancelled`` once its run is cancelled
    with ``interrupt=True`` (asked at most once per CANCEL_CHECK)."""

    def __init__(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        settings: conf.Settings,
        heartbeat_timeout: timedelta | None = None,
    ) -> None:
        self.key = (run_id, seq, attempt)
        self.db = settings.DATABASE
        self.max_bytes = settings.MAX_PAYLOAD_BYTES
        self.throttle = settings.HEARTBEAT_PERSIST_THROTTLE
        if heartbeat_timeout is not None:
            self.throttle = beat_grace(heartbeat_timeout, self.throttle)
        self.last: datetime | None = None
        self.last_had_progress = False
        self.unsaved: tuple[Any] | None = None
        self.checked: datetime | None = None

    def __call__(self, progress: Any = None) -> None:
        if progress is not None:
            progress = json_value(progress, "heartbeat progress", max_bytes=self.max_bytes)
        now = clock.now()
        due = (
            self.last is None
            or now - self.last >= self.throttle
            or (progress is not None and not self.last_had_progress)
        )
        if due:
            Checkpoint.objects.using(self.db).beat(*self.key, now, progress, progress is not None)
            self.last, self.last_had_progress = now, progress is not None
            self.unsaved = None
        elif progress is not None:
            self.unsaved = (progress,)
        self._check_cancel(now)

    def interrupted(self) -> bool:
        """Whether the step's run was cancelled with interrupt=True (an async step is cancelled
        then, at whatever it awaits, heartbeat or not)."""
        run_id, seq, _ = self.key
        return bool(Run.objects.using(self.db).interrupted(run_id, seq))

    def _check_cancel(self, now: datetime) -> None:
        if self.checked is not None and now - self.checked < CANCEL_CHECK:
            return
        self.checked = now
        run_id, seq, attempt = self.key
        if Run.objects.using(self.db).interrupted(run_id, seq):
            raise StepCancelled(
                f"run {run_id} was cancelled with interrupt=True: step attempt {seq}#{attempt} stops here"
            )

    def keep_last(self, checkpoints: Any) -> None:
        """Persist the newest progress a throttled beat skipped, so it outlives the step."""
        if self.unsaved is not None:
            run_id, seq, _ = self.key
            checkpoints.filter(run_id=run_id, seq=seq).update(progress=self.unsaved[0])
