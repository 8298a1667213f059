"""Durable's Celery tasks: thin wrappers that call the engine. Their names are stable API."""

from __future__ import annotations

from celery import shared_task

from .engine import steps, sweeps, turn

# At-least-once delivery: a message is acknowledged only after the work, and redelivered when
# the worker process dies. The engine makes every duplicate harmless.
_RELIABLE = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


@shared_task(name="durable.advance", **_RELIABLE)
def advance(run_id: str) -> str:
    return turn.advance(run_id)


@shared_task(name="durable.run_step", **_RELIABLE)
def run_step(run_id: str, seq: int, attempt: int) -> str:
    return steps.run_step(run_id, seq, attempt)


@shared_task(name="durable.sweep_timers", ignore_result=True)
def sweep_timers() -> int:
    return sweeps.sweep_timers()


@shared_task(name="durable.sweep_orphans", ignore_result=True)
def sweep_orphans() -> int:
    return sweeps.sweep_orphans()
