"""Execute one dispatched step attempt on a worker and record its result exactly once.

A duplicate or stale delivery finds the attempt no longer pending and changes nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import transaction

from .. import clock, conf, dispatch
from ..definitions import Step, registry
from ..errors import InvalidInput, WorkflowNotRegistered
from ..history import PENDING, roundtrip
from ..models import Checkpoint, Run
from ..stepscope import StepInfo
from . import attempts, turn
from .attempts import Beats

log = logging.getLogger("durable.engine")

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
    began = time.monotonic()
    row = Checkpoint.objects.using(db).take(run_id, seq, attempt, clock.now())
    if row is None:
        return "stale"
    beats = Beats(run_id, seq, attempt, settings)
    try:
        step = registry.step(row.name)
        output, error, retryable = attempts.execute(step, StepInfo(run_id, seq, attempt, row.name), row.input, beats)
    except WorkflowNotRegistered as exc:
        step, output, error, retryable = None, None, exc.to_dict(), True
    return record(row, step, output, error, retryable, beats, began)


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
    beats: Beats | None, began: float | None = None,
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
        next_turn(run_id, woken, settings, began)
    return "completed" if error is None else "failed"


def recorded_retry(step: Step | None, retryable: bool, attempt: int) -> bool:
    """Whether a failed attempt was recorded as a retry (the position stays pending)."""
    return retryable and (step is None or attempt < step.retry.max_attempts)


def next_turn(run_id: str, queue: str, settings: conf.Settings, began: float | None = None) -> None:
    """Run the next turn here when this worker serves the run's queue, else send it there.

    A Celery time limit set for the step just recorded (its ``timeout``) goes on ticking: the turn
    runs here only with at least a LEASE of it left, the time a turn is given anyway."""
    limit = attempts.time_limit()
    if limit is not None:
        left = limit - (time.monotonic() - began) if began is not None else 0.0
        if left < settings.LEASE.total_seconds():
            dispatch.advance(run_id, queue)
            return
    if settings.INLINE_NEXT_TURN and attempts.serves(queue):
        turn.advance(run_id)
    else:
        dispatch.advance(run_id, queue)
