"""Execute one dispatched step attempt on a worker and record its result exactly once.

A duplicate or stale delivery finds the attempt no longer pending and changes nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from .. import clock, conf, dispatch
from ..definitions import Step, registry
from ..errors import InvalidInput, WorkflowNotRegistered, error_dict
from ..history import PENDING, roundtrip
from ..models import Checkpoint, Run
from ..stepscope import StepInfo, step_scope
from . import turn

log = logging.getLogger("durable.engine")

#: Queues this process consumes, set when a Celery worker starts; None means "all of them"
#: (the test harness), an empty set means "not a worker".
served_queues: set[str] | None = set()


def _attempt_row(run_id: str, seq: int, attempt: int, db: str) -> Checkpoint | None:
    """The checkpoint of this attempt if it is still pending and its run unfinished."""
    row = (
        Checkpoint.objects.using(db)
        .select_related("run")
        .filter(run_id=run_id, seq=seq)
        .only("seq", "name", "status", "attempt", "input", "fan", "fail_fast", "run__status")
        .first()
    )
    if row is None or row.status != PENDING or row.attempt != attempt or row.run.is_finished:
        return None
    return row


def run_step(run_id: str, seq: int, attempt: int) -> str:
    """Run attempt ``attempt`` of the step at position ``seq`` of ``run_id``, record the result."""
    settings = conf.get()
    db = settings.DATABASE
    row = Checkpoint.objects.using(db).take(run_id, seq, attempt, clock.now())
    if row is None:
        return "stale"
    beats = _Beats(run_id, seq, attempt, settings)
    try:
        step = registry.step(row.name)
        output, error, retryable = _execute(step, StepInfo(run_id, seq, attempt, row.name), row.input, beats)
    except WorkflowNotRegistered as exc:
        step, output, error, retryable = None, None, exc.to_dict(), True
    return record(row, step, output, error, retryable, beats)


def step_result(run_id: str, seq: int, attempt: int, output: Any = None, error: dict[str, Any] | None = None) -> str:
    """Record the result a Celery task (or a worker in another language) reports for a step."""
    settings = conf.get()
    row = _attempt_row(run_id, seq, attempt, settings.DATABASE)
    if row is None:
        return "stale"
    if error is None:
        try:
            output = roundtrip(output, what=f"the result of task {row.name!r}")
        except InvalidInput as exc:
            error = {**exc.to_dict(), "code": "invalid_output"}
    # A Celery task retries by its own settings: what reaches durable is its final result.
    return record(row, None, output, error, False, None)


def heartbeat(run_id: str, seq: int, attempt: int, progress: Any = None) -> bool:
    """A beat sent as a message by a worker that only speaks Celery."""
    settings = conf.get()
    progress = None if progress is None else roundtrip(progress, what="heartbeat progress")
    return Checkpoint.objects.using(settings.DATABASE).beat(
        run_id, seq, attempt, clock.now(), progress, progress is not None
    )


def record(
    row: Checkpoint, step: Step | None, output: Any, error: dict[str, Any] | None, retryable: bool,
    beats: _Beats | None,
) -> str:
    """Record one attempt's result exactly once, then wake the run when it should be woken."""
    settings = conf.get()
    db = settings.DATABASE
    run_id, seq, attempt = row.run_id, row.seq, row.attempt
    now = clock.now()
    woken: str | None = None  # the run's queue, once a wake reached it
    joins_later = False
    with transaction.atomic(using=db):
        checkpoints = Checkpoint.objects.using(db)
        if error is None:
            recorded = checkpoints.complete(run_id, seq, attempt, output, now)
        elif recorded_retry(step, retryable, attempt):
            # A worker without the step's code retries after the reconcile interval.
            delay = step.retry.delay(attempt) if step is not None else settings.RECONCILE_INTERVAL
            recorded = checkpoints.retry_at(run_id, seq, attempt, error, now + delay)
        else:
            recorded = checkpoints.fail(run_id, seq, attempt, error, now)
        if recorded and beats is not None:
            beats.keep_last(checkpoints)
        if recorded:
            settled = error is None or not recorded_retry(step, retryable, attempt)
            joins_later = row.fan is not None and settled and not (error is not None and row.fail_fast)
            if not joins_later:
                woken = Run.objects.using(db).wake(run_id, now, now + settings.LEASE)
    if not recorded:
        return "stale"
    # A fan member wakes the run only once the fan is closed. Asked after this result committed,
    # so the last member always sees it closed (two may: the second turn is a harmless replay).
    if joins_later and Checkpoint.objects.using(db).fan_closed(run_id, row.fan):
        woken = Run.objects.using(db).wake(run_id, now, now + settings.LEASE)
    if woken:
        next_turn(run_id, woken, settings)
    return "completed" if error is None else "failed"


def recorded_retry(step: Step | None, retryable: bool, attempt: int) -> bool:
    """Whether a failed attempt was recorded as a retry (the position stays pending)."""
    return retryable and (step is None or attempt < step.retry.max_attempts)


def next_turn(run_id: str, queue: str, settings: conf.Settings) -> None:
    """Run the next turn here when this worker serves the run's queue, else send it there."""
    if settings.INLINE_NEXT_TURN and (served_queues is None or queue in served_queues):
        turn.advance(run_id)
    else:
        dispatch.advance(run_id, queue)


def _execute(step: Step, info: StepInfo, payload: Any, beats: _Beats) -> tuple[Any, dict[str, Any] | None, bool]:
    """Call the step; return (output, error, retryable)."""
    from celery.exceptions import SoftTimeLimitExceeded

    args = payload or {}
    try:
        with step_scope(info, beats):
            output = step.fn(*args.get("args", []), **args.get("kwargs", {}))
        return roundtrip(output, what=f"the output of step {step.name!r}"), None, True
    except SoftTimeLimitExceeded:
        return None, {
            "message": f"step {step.name!r} ran past its timeout of {step.timeout}",
            "type": "StepTimeout",
            "code": "timeout",
            "details": None,
        }, True
    except InvalidInput as exc:
        return None, {**exc.to_dict(), "code": "invalid_output"}, False
    except Exception as exc:  # noqa: BLE001 - any step error is a failed attempt
        log.info("durable: step %s of run %s attempt %s failed: %r", step.name, info.run_id, info.attempt, exc)
        return None, error_dict(exc), step.retry.is_retryable(exc)


class _Beats:
    """``durable.heartbeat()`` for a dispatched step: persist at most once per throttle window."""

    def __init__(self, run_id: str, seq: int, attempt: int, settings: conf.Settings) -> None:
        self.key = (run_id, seq, attempt)
        self.db = settings.DATABASE
        self.throttle = settings.HEARTBEAT_PERSIST_THROTTLE
        self.last: datetime | None = None
        self.last_had_progress = False
        self.unsaved: tuple[Any] | None = None

    def __call__(self, progress: Any = None) -> None:
        if progress is not None:
            progress = roundtrip(progress, what="heartbeat progress")
        now = clock.now()
        due = (
            self.last is None
            or now - self.last >= self.throttle
            or (progress is not None and not self.last_had_progress)
        )
        if not due:
            if progress is not None:
                self.unsaved = (progress,)
            return
        Checkpoint.objects.using(self.db).beat(*self.key, now, progress, progress is not None)
        self.last, self.last_had_progress = now, progress is not None
        self.unsaved = None

    def keep_last(self, checkpoints: Any) -> None:
        """Persist the newest progress a throttled beat skipped, so it outlives the step."""
        if self.unsaved is not None:
            run_id, seq, _ = self.key
            checkpoints.filter(run_id=run_id, seq=seq).update(progress=self.unsaved[0])
