"""Durable's Celery tasks: thin wrappers that call the engine. Their names are stable API."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import remote
from .engine import (
    decisions,
    entity_ops,
    lifecycle,
    redispatch,
    remote_turns,
    results_by_message,
    steps,
    sweeps,
    wake_batches,
)

# At-least-once delivery: a message is acknowledged only after the work, and redelivered when
# the worker process dies. The engine makes every duplicate harmless.
_RELIABLE = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


def _was_redelivered(task: Any) -> bool:
    # The process that had this message died before acknowledging it: it may have committed
    # sends it never published.
    return bool((task.request.delivery_info or {}).get("redelivered"))


def _redelivered(task: Any, run_id: str) -> None:
    if _was_redelivered(task):
        lifecycle.resend_unsent(run_id)


@shared_task(name="durable.advance", bind=True, **_RELIABLE)
def advance(self: Any, run_id: str) -> str:
    return wake_batches.advance_one(run_id, redelivered=_was_redelivered(self))


@shared_task(name="durable.advance_batch", bind=True, **_RELIABLE)
def advance_batch(self: Any, run_ids: list[str]) -> list[str]:
    """The turns of several runs, one after the other, as ``durable.advance`` runs each: a sweep
    sends its wakes this way. A turn that raises does not stop the others."""
    return wake_batches.advance_batch(run_ids, redelivered=_was_redelivered(self))


@shared_task(name="durable.run_step", bind=True, **_RELIABLE)
def run_step(self: Any, run_id: str, seq: int, attempt: int, token: str | None = None) -> str:
    _redelivered(self, run_id)
    return steps.run_step(run_id, seq, attempt, token)


@shared_task(name="durable.probe", ignore_result=True)
def probe(queue: str, sent_at: str) -> int:
    """Taken from ``queue``: the step messages sent down it before ``sent_at`` were taken too."""
    return redispatch.probed(queue, sent_at)


@shared_task(name="durable.apply_entity", **_RELIABLE)
def apply_entity(name: str, key: str) -> int:
    return entity_ops.apply(name, key)


@shared_task(name="durable.sweep_entities", ignore_result=True)
def sweep_entities() -> int:
    return sweeps.run_noted("durable.sweep_entities")


@shared_task(name="durable.sweep_timers", ignore_result=True)
def sweep_timers() -> int:
    return sweeps.run_noted("durable.sweep_timers")


@shared_task(name="durable.sweep_orphans", ignore_result=True)
def sweep_orphans() -> int:
    return sweeps.run_noted("durable.sweep_orphans")


@shared_task(name="durable.sweep_retention", ignore_result=True)
def sweep_retention() -> int:
    return sweeps.run_noted("durable.sweep_retention")


@shared_task(name="durable.sweep_schedules", ignore_result=True)
def sweep_schedules() -> int:
    return sweeps.run_noted("durable.sweep_schedules")


@shared_task(name="durable.step_result", **_RELIABLE)
def step_result(
    output: Any = None,
    run_id: str = "",
    seq: int = 0,
    attempt: int = 1,
    error: Any = None,
    token: str | None = None,
) -> str:
    """Record a Celery task step's result; Celery calls it as the ``link`` of a task used as a
    step, and a worker in another language may send it itself (``error`` set means the attempt
    failed). Only with the attempt's ``token``, which durable sent with the task."""
    return results_by_message.step_result(run_id, seq, attempt, output, error, token)


@shared_task(name="durable.step_failed", ignore_result=True)
def step_failed(
    *failure: Any,
    run_id: str = "",
    seq: int = 0,
    attempt: int = 1,
    token: str | None = None,
) -> str:
    """The ``link_error`` of a task used as a step. Where the task failed, a worker that has
    durable installed calls it in place with ``(request, exc, traceback)``; one that has not (a
    plain Celery worker) sends it as a message with only the failed task's id, the way Celery
    calls an errback it does not know. Either way the attempt is recorded as failed."""
    return results_by_message.task_failed(run_id, seq, attempt, failure, token)


@shared_task(name="durable.heartbeat", ignore_result=True)
def heartbeat(
    run_id: str,
    seq: int,
    attempt: int,
    progress: Any = None,
    token: str | None = None,
    sent_at: float | None = None,
) -> bool:
    """A step's heartbeat sent as a message, for workers that only speak Celery."""
    return results_by_message.heartbeat(run_id, seq, attempt, progress, token, sent_at)


@shared_task(name="durable.remote_turn", **_RELIABLE)
def remote_turn(turn: dict[str, Any]) -> str:
    """Replay one turn of a remote workflow on a worker that may have no database; its decision
    goes back as ``durable.decision``. Only remote workers consume the queues it is sent to."""
    return remote.run_turn(turn)


@shared_task(name="durable.decision", **_RELIABLE)
def decision(**message: Any) -> str:
    """Apply what a remote turn decided, at most once, only while its turn holds the lease."""
    return decisions.apply(message)


@shared_task(name="durable.turn_heartbeat", ignore_result=True)
def turn_heartbeat(run_id: str = "", turn: str = "") -> bool:
    """A remote turn is alive: renew its lease, if it still holds it."""
    return remote_turns.heartbeat(run_id, turn)
