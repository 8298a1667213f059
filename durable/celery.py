"""Celery wiring: the beat schedule of the sweeps, and what a worker learns at start-up."""

from __future__ import annotations

from typing import Any

from celery import signals

from . import conf
from .engine import steps

SWEEPS = {
    "durable.sweep_timers": "TIMER_SWEEP_INTERVAL",
    "durable.sweep_orphans": "ORPHAN_SWEEP_INTERVAL",
}


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The sweeps as beat entries, for projects that build their schedule by hand."""
    settings = conf.get()
    return {
        task: {
            "task": task,
            "schedule": getattr(settings, interval).total_seconds(),
            "options": {"queue": settings.DEFAULT_QUEUE, "expires": getattr(settings, interval).total_seconds() * 5},
        }
        for task, interval in SWEEPS.items()
    }


@signals.beat_init.connect
def _add_sweeps(sender: Any = None, **_: Any) -> None:
    # Entries the project defined itself (same key) win.
    scheduler = sender.scheduler
    missing = {k: v for k, v in beat_schedule().items() if k not in scheduler.schedule}
    if missing:
        scheduler.update_from_dict(missing)


@signals.celeryd_after_setup.connect
def _note_queues(sender: Any = None, instance: Any = None, **_: Any) -> None:
    # The worker runs a run's next turn itself only when it consumes that run's queue.
    steps.served_queues = set(instance.app.amqp.queues.consume_from)
