"""Saga unwinding for the replay core: run the compensations of completed steps, newest first.

A run unwinds when an error escapes its body, or when a cancel with ``compensate=True`` was
requested. Steps still in flight are waited for first, so one that completes after the cancel is
compensated too. Each compensation is a durable step at a position past the body's, so the
unwind itself survives crashes and replays like any other history.
"""

from __future__ import annotations

from typing import Any

from ..definitions import COMPENSATE_PREFIX, compensation_of, registry
from ..errors import ErrorCode, StepFailed, WorkflowNotRegistered
from ..statuses import Decided
from .history import COMPLETED, PENDING, Decision, Record
from .positions import Pending, Positions

#: Compensations take positions from here on, after any position a body can reach.
COMPENSATION_BASE = 1_000_000_000


def needs_unwind(ctx: Positions) -> bool:
    """Whether the history holds a completed step with a compensation, or an unwind under way."""
    return any(rec.kind == "compensation" or _undo_of(rec) is not None for rec in ctx._turn.records.values())


def unwind(ctx: Positions, final: Decision) -> Decision:
    """Compensate, then settle as ``final``; suspend while a compensation or a step is in flight."""
    records = ctx._turn.records
    in_flight = [
        rec
        for rec in records.values()
        if rec.kind == "step"
        and rec.status == PENDING
        and rec.enqueued_at is not None
        and rec.seq < COMPENSATION_BASE
    ]
    for rec in in_flight:
        answer = ctx._resolve_step(rec, ctx._definition_of(rec))
        if isinstance(answer, Pending):
            return _suspended(ctx, answer.wake_at)
    done = sorted(
        (rec for rec in records.values() if rec.seq < COMPENSATION_BASE and _undo_of(rec) is not None),
        key=lambda rec: rec.seq,
        reverse=True,
    )
    failed = False
    for k, rec in enumerate(done):
        step = compensation_of(registry.step(rec.name))
        position = COMPENSATION_BASE + k
        comp = records.get(position)
        if comp is None:
            args = rec.input or {}
            comp = Record(
                seq=position,
                kind="compensation",
                name=step.name,
                input={
                    "args": [rec.output, *args.get("args", [])],
                    "kwargs": args.get("kwargs", {}),
                    # The undo of a remote step runs where the step did, reported the same way.
                    **({"remote": True} if ctx._is_remote(step) else {}),
                },
                queue=ctx._queue_of(step),
            )
            records[position] = comp
            if not step.local:
                ctx._send(comp, step)
        answer = ctx._resolve_step(comp, step)
        if isinstance(answer, Pending):
            return _suspended(ctx, answer.wake_at)
        failed = failed or isinstance(answer, StepFailed)
    if failed and final.error is not None:
        final.error = {**final.error, "code": ErrorCode.COMPENSATION_FAILED}
    return final


def _undo_of(rec: Record) -> Any:
    if rec.kind != "step" or rec.status != COMPLETED or rec.name.startswith(COMPENSATE_PREFIX):
        return None
    try:
        return registry.step(rec.name).compensate
    except WorkflowNotRegistered:
        return None


def _suspended(ctx: Positions, wake_at: Any) -> Decision:
    now = ctx._now()
    return Decision(
        Decided.SUSPENDED, wake_at=min(filter(None, [wake_at, now + ctx._limits.reconcile_interval]))
    )
