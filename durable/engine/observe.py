"""Tell the world how runs and step attempts went: the lifecycle signals, log records and
metrics, sent after the change commits, and the spans of step attempts a turn ran or judged.

Nothing here writes to the database; with no receiver, the log level above and nothing recording
metrics, it costs a check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from .. import clock, conf, metrics, signals, tracing
from ..models import Checkpoint, Run, Status
from ..replay.history import COMPLETED, FAILED, PENDING, Record
from ..values import decode

log = logging.getLogger("durable.lifecycle")

_ENDED = {
    Status.COMPLETED: (signals.run_completed, logging.INFO),
    Status.FAILED: (signals.run_failed, logging.WARNING),
    Status.CANCELLED: (signals.run_cancelled, logging.INFO),
    Status.DEAD: (signals.run_dead, logging.ERROR),
}


def _since(start: datetime | None, end: datetime | None) -> timedelta | None:
    return end - start if start is not None and end is not None else None


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else round(delta.total_seconds(), 6)


def _emit(
    signal: Signal,
    sender: type,
    level: int,
    message: str,
    args: tuple[Any, ...],
    measure: metrics.Recorder | None = None,
    **facts: Any,
) -> None:
    """Send ``signal``, log ``message`` and record ``measure``'s metrics once the current
    transaction commits (at once outside one): a transition rolled back reports nothing."""
    listening = signal.has_listeners(sender)
    logging_it = log.isEnabledFor(level)
    if not listening and not logging_it:
        if measure is not None:
            transaction.on_commit(measure, using=conf.get().DATABASE)
        return
    extra = {
        key: (_seconds(value) if isinstance(value, timedelta) else value)
        for key, value in facts.items()
        if key not in ("output", "error", "name")
    }
    if "name" in facts:
        extra["step"] = facts["name"]  # "name" is taken by the log record itself
    if facts.get("error"):
        extra["error_code"] = facts["error"].get("code")

    def send() -> None:
        if measure is not None:
            measure()
        if logging_it:
            log.log(level, message, *args, extra=extra)
        if listening:
            if "output" in facts:
                facts["output"] = decode(facts["output"])  # as durable.result returns it
            # Django logs a receiver that raises; the change it reports stands.
            signal.send_robust(sender=sender, **facts)

    transaction.on_commit(send, using=conf.get().DATABASE)


def _run_facts(run: Run, now: datetime) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "workflow": run.workflow,
        "version": run.version,
        "namespace": run.namespace or None,
        "status": run.status,
        "queue_wait": _since(run.created_at, run.started_at),
        "duration": _since(run.started_at, run.finished_at or now),
    }


def run_started(run: Run) -> None:
    """The turn that just claimed ``run`` is its first."""
    facts = _run_facts(run, clock.now())
    _emit(
        signals.run_started,
        Run,
        logging.DEBUG,
        "durable: run %s (%s) started",
        (run.id, run.workflow),
        metrics.run_started(run.workflow, run.namespace),
        **facts,
    )


def run_suspended(run: Run, wake_at: datetime | None) -> None:
    facts = {**_run_facts(run, clock.now()), "status": Status.SUSPENDED, "wake_at": wake_at}
    _emit(
        signals.run_suspended,
        Run,
        logging.DEBUG,
        "durable: run %s (%s) suspended until %s",
        (run.id, run.workflow, wake_at),
        **facts,
    )


def run_blocked(run: Run, error: dict[str, Any], wake_at: datetime, reason: str) -> None:
    """A turn of ``run`` found non-determinism and parked it until ``wake_at``."""
    facts = {
        **_run_facts(run, clock.now()),
        "status": Status.SUSPENDED,
        "error": error,
        "wake_at": wake_at,
        "reason": reason,
    }
    _emit(
        signals.run_blocked,
        Run,
        logging.WARNING,
        "durable: run %s (%s) %s; next try at %s",
        (run.id, run.workflow, reason, wake_at),
        **facts,
    )


def run_ended(run: Run) -> None:
    """``run`` reached its terminal status (call inside the transaction that ended it)."""
    signal, level = _ENDED[Status(run.status)]
    facts = {**_run_facts(run, clock.now()), "output": run.output, "error": run.error}
    duration = facts["duration"]
    _emit(
        signal,
        Run,
        level,
        "durable: run %s (%s) %s after %ss%s",
        (run.id, run.workflow, run.status, _seconds(duration), _reason(run.error)),
        metrics.run_ended(run.status, run.workflow, run.namespace, duration),
        **facts,
    )


def step_started(row: Checkpoint, now: datetime) -> None:
    """A worker took attempt ``row.attempt`` of the step at ``row.seq``."""
    _emit(
        signals.step_started,
        Checkpoint,
        logging.DEBUG,
        "durable: step %s of run %s#%s attempt %s started",
        (row.name, row.run_id, row.seq, row.attempt),
        run_id=row.run_id,
        seq=row.seq,
        name=row.name,
        attempt=row.attempt,
        queue=row.queue or None,
        queue_wait=_since(row.enqueued_at, now),
        duration=None,
    )


def step_recorded(
    run_id: str,
    seq: int,
    name: str,
    attempt: int,
    *,
    queue: str | None,
    enqueued_at: datetime | None,
    began: datetime | None,
    status: str,
    output: Any = None,
    error: dict[str, Any] | None = None,
    retry_at: datetime | None = None,
) -> None:
    """Attempt ``attempt`` of the step at ``seq`` ended: ``status`` completed, failed (for good)
    or pending (the next attempt is due at ``retry_at``)."""
    now = clock.now()
    facts: dict[str, Any] = {
        "run_id": run_id,
        "seq": seq,
        "name": name,
        "attempt": attempt,
        "queue": queue or None,
        "queue_wait": _since(enqueued_at, began),
        "duration": _since(began, now),
    }
    where = (name, run_id, seq, attempt)
    outcome = "completed" if status == COMPLETED else "failed" if status == FAILED else "retried"
    measure = metrics.step_ended(
        name, queue, conf.get().NAMESPACE, outcome, facts["queue_wait"], facts["duration"]
    )
    if status == COMPLETED:
        _emit(
            signals.step_completed,
            Checkpoint,
            logging.DEBUG,
            "durable: step %s of run %s#%s attempt %s completed",
            where,
            measure,
            output=output,
            **facts,
        )
    elif status == FAILED:
        _emit(
            signals.step_failed,
            Checkpoint,
            logging.WARNING,
            "durable: step %s of run %s#%s failed for good at attempt %s%s",
            (*where, _reason(error)),
            measure,
            error=error,
            **facts,
        )
    else:
        _emit(
            signals.step_retried,
            Checkpoint,
            logging.INFO,
            "durable: step %s of run %s#%s attempt %s failed; the next is due at %s%s",
            (*where, retry_at, _reason(error)),
            measure,
            error=error,
            retry_at=retry_at,
            **facts,
        )


def _recorded(run_id: str, rec: Record, attempt: int, began: datetime | None, **fields: Any) -> None:
    step_recorded(
        run_id,
        rec.seq,
        rec.name,
        attempt,
        queue=rec.queue,
        enqueued_at=rec.enqueued_at,
        began=began,
        **fields,
    )


def positions(run_id: str, records: Iterable[Record]) -> None:
    """Report the step attempts a turn ran itself (local and in-place steps) or judged (lost,
    timed out) among the positions it just wrote; a dispatched attempt's worker reports its own."""
    for rec in records:
        if rec.kind != "step":
            continue
        was = rec.stored_as
        if was == (rec.status, rec.attempt):
            continue
        ran_here = rec.queue == "" or (rec.enqueued_at is None and rec.started_at is not None)
        if rec.status in (COMPLETED, FAILED):
            _attempt_span(run_id, rec, rec.attempt, rec.started_at, rec.finished_at)
            if ran_here and rec.status == COMPLETED:
                _started_in_turn(run_id, rec, rec.attempt)
            _recorded(
                run_id,
                rec,
                rec.attempt,
                rec.started_at,
                status=rec.status,
                output=rec.output,
                error=rec.error,
            )
        elif rec.status == PENDING and was is not None and rec.attempt > was[1]:
            # Failed attempts the turn counted (one or more, each its own ``attempt``).
            for failed in range(was[1], rec.attempt):
                _attempt_span(run_id, rec, failed, None, None)
                _recorded(run_id, rec, failed, None, status=PENDING, error=rec.error, retry_at=rec.wake_at)


def _started_in_turn(run_id: str, rec: Record, attempt: int) -> None:
    _emit(
        signals.step_started,
        Checkpoint,
        logging.DEBUG,
        "durable: step %s of run %s#%s attempt %s ran in its turn",
        (rec.name, run_id, rec.seq, attempt),
        run_id=run_id,
        seq=rec.seq,
        name=rec.name,
        attempt=attempt,
        queue=rec.queue or None,
        queue_wait=None,
        duration=None,
    )


def _attempt_span(
    run_id: str, rec: Record, attempt: int, start: datetime | None, end: datetime | None
) -> None:
    if not tracing.enabled():
        return
    error = rec.error if rec.status != COMPLETED else None
    tracing.record_span(
        f"durable.step {rec.name}",
        run_id,
        {
            "durable.run_id": run_id,
            "durable.seq": rec.seq,
            "durable.step": rec.name,
            "durable.attempt": attempt,
        },
        start,
        end,
        error,
    )


def _reason(error: dict[str, Any] | None) -> str:
    if not error:
        return ""
    code = f" [{error.get('code')}]" if error.get("code") else ""
    return f": {error.get('type')}{code}: {str(error.get('message'))[:300]}"
