"""Run one turn of a run under its lease: load the history, replay the body, persist the outcome.

A turn's writes are fenced: each is conditional on this turn still holding the lease, and the
final settle also on the run's wake counter, so a wake that lands mid-turn makes the turn run
again instead of going to sleep on stale facts.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction

from .. import clock, conf, dispatch
from ..context import RunFacts, TurnState, replay
from ..definitions import registry
from ..errors import WorkflowNotRegistered, _ControlFlow
from ..history import BufferedSignal, Limits, Outcome, Record
from ..models import Checkpoint, Run, Signal, Status

log = logging.getLogger("durable.engine")

#: A turn re-runs at most this many times in a row because wakes kept arriving.
MAX_RERUNS = 20


class LeaseLost(_ControlFlow):
    """This turn's lease was taken over: it must write nothing more."""


class _Stale(Exception):
    """A guarded write matched no row: something changed since the turn read the run."""


def limits(settings: conf.Settings) -> Limits:
    return Limits(
        reconcile_interval=settings.RECONCILE_INTERVAL,
        redispatch_after=settings.STEP_REDISPATCH_AFTER,
        timeout_grace=settings.STEP_TIMEOUT_GRACE,
        heartbeat_throttle=settings.HEARTBEAT_PERSIST_THROTTLE,
        default_queue=settings.DEFAULT_QUEUE,
    )


def advance(run_id: str) -> str:
    """Run turns of ``run_id`` until it settles; return what happened, for logs and tests."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE)
    owner = f"{settings.INSTANCE_ID}/{uuid.uuid4().hex[:12]}"
    if not runs.claim(run_id, owner, clock.now(), settings.LEASE):
        return "busy"
    for _ in range(MAX_RERUNS):
        run = runs.filter(id=run_id, locked_by=owner).first()
        if run is None:
            return "lost"
        if run.recovery_attempts > settings.MAX_RECOVERY_ATTEMPTS:
            runs.die(run_id, recovery_exhausted(run.recovery_attempts - 1), clock.now())
            return Status.DEAD
        try:
            outcome = _turn(run, owner, settings)
        except LeaseLost:
            return "lost"
        except _Stale:
            if not runs.renew(run_id, owner, clock.now(), settings.LEASE):
                return "lost"
            continue
        if outcome is not None:
            return outcome.status
        return "parked"
    runs.release(run_id, owner, clock.now(), clock.now())
    return "busy"


def recovery_exhausted(attempts: int) -> dict[str, Any]:
    return {
        "message": f"the run's turns crashed or lost their lease {attempts} times in a row",
        "type": "RecoveryExhausted",
        "code": "max_recovery_attempts",
        "details": {"recovery_attempts": attempts},
    }


def _turn(run: Run, owner: str, settings: conf.Settings) -> Outcome | None:
    db = settings.DATABASE
    try:
        workflow = registry.workflow(run.workflow, run.version)
    except WorkflowNotRegistered:
        # A rolling deploy: this worker lacks the code. Leave the run for one that has it.
        log.warning("durable: %s@%s is not registered here; run %s left for another worker",
                    run.workflow, run.version, run.id)
        Run.objects.using(db).release(run.id, owner, clock.now(), clock.now() + settings.RECONCILE_INTERVAL)
        return None
    state = TurnState(records=_load_records(run.id, db), signals=_load_signals(run.id, db))

    def flush(current: TurnState) -> None:
        with transaction.atomic(using=db):
            if not Run.objects.using(db).renew(run.id, owner, clock.now(), settings.LEASE):
                raise LeaseLost()
            _write(run.id, current, settings)
        _mark_saved(current)

    def renew() -> None:
        if not Run.objects.using(db).renew(run.id, owner, clock.now(), settings.LEASE):
            raise LeaseLost()

    outcome = replay(
        workflow,
        RunFacts(run.id, run.workflow, run.version, run.namespace or None, run.input),
        state,
        clock=clock.now,
        limits=limits(settings),
        flush=flush,
        renew=renew,
    )
    with transaction.atomic(using=db):
        _write(run.id, state, settings)
        if not Run.objects.using(db).settle(run.id, owner, run.wakes, clock.now(), **_run_fields(outcome)):
            raise _Stale()
    return outcome


def _run_fields(outcome: Outcome) -> dict[str, Any]:
    now = clock.now()
    if outcome.status == "completed":
        return {"status": Status.COMPLETED, "output": outcome.output, "finished_at": now, "wake_at": None}
    if outcome.status == "failed":
        return {
            "status": Status.FAILED,
            "error": outcome.error,
            "failed_seqs": outcome.failed_seqs,
            "finished_at": now,
            "wake_at": None,
        }
    return {"status": Status.SUSPENDED, "wake_at": outcome.wake_at}


def _load_records(run_id: str, db: str) -> dict[int, Record]:
    records = {}
    for row in Checkpoint.objects.using(db).filter(run_id=run_id).order_by("seq"):
        records[row.seq] = Record(
            seq=row.seq,
            kind=row.kind,
            name=row.name,
            status=row.status,
            attempt=row.attempt,
            input=row.input,
            output=row.output,
            error=row.error,
            wake_at=row.wake_at,
            enqueued_at=row.enqueued_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            last_heartbeat_at=row.last_heartbeat_at,
            queue=row.queue,
            stored_as=(row.status, row.attempt),
        )
    return records


def _load_signals(run_id: str, db: str) -> list[BufferedSignal]:
    rows = Signal.objects.using(db).filter(run_id=run_id, consumed_seq__isnull=True).order_by("id")
    return [BufferedSignal(s.id, s.name, s.payload) for s in rows]


_WRITTEN = (
    "status", "attempt", "output", "error", "wake_at", "enqueued_at", "started_at",
    "finished_at", "last_heartbeat_at",
)


def _write(run_id: str, state: TurnState, settings: conf.Settings) -> None:
    """Persist what the turn changed; raise _Stale if a guarded write lost a race."""
    db = settings.DATABASE
    checkpoints = Checkpoint.objects.using(db)
    new = []
    for rec in state.unsaved():
        if rec.stored_as is None:
            new.append(
                Checkpoint(
                    run_id=run_id, seq=rec.seq, kind=rec.kind, name=rec.name, queue=rec.queue,
                    input=rec.input, **{f: getattr(rec, f) for f in _WRITTEN},
                )
            )
        else:
            if not checkpoints.rewrite(run_id, rec.seq, rec.stored_as, **{f: getattr(rec, f) for f in _WRITTEN}):
                raise _Stale()
    if new:
        checkpoints.bulk_create(new)
    for signal in state.consumed:
        if not Signal.objects.using(db).consume(signal.id, signal.consumed_seq or 0):
            raise _Stale()
    state.consumed.clear()
    for rec in state.dispatch:
        step = registry.step(rec.name)
        dispatch.run_step(run_id, rec.seq, rec.attempt, rec.queue, step.timeout, settings.STEP_TIMEOUT_GRACE)
    state.dispatch.clear()


def _mark_saved(state: TurnState) -> None:
    for rec in state.records.values():
        rec.stored_as = (rec.status, rec.attempt)
        rec.dirty = False
