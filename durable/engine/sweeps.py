"""Beat sweeps: the repairs that make every run converge whatever messages were lost.

Each pass is bounded and idempotent; two beats running them at once only duplicate hints.
"""

from __future__ import annotations

from django.db import transaction

from .. import clock, conf, dispatch
from ..models import Run
from .turn import recovery_exhausted

#: Batches one timer pass takes at most, so one pass stays short under a backlog.
MAX_BATCHES = 20


def sweep_timers() -> int:
    """Send a turn to every run whose timer, retry backoff or safety-net wake is due."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE)
    woken = 0
    for _ in range(MAX_BATCHES):
        now = clock.now()
        with transaction.atomic(using=settings.DATABASE):
            due = runs.due(now, settings.TIMER_BATCH_SIZE)
            if due:
                # The next safety-net wake; the turn sets the real one when it settles.
                runs.push_wake([run_id for run_id, _ in due], now, now + settings.RECONCILE_INTERVAL)
                for run_id, queue in due:
                    dispatch.advance(run_id, queue)
        woken += len(due)
        if len(due) < settings.TIMER_BATCH_SIZE:
            break
    return woken


def sweep_orphans() -> int:
    """Re-drive runs whose turn died holding its lease; past the budget they go ``dead``."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE)
    now = clock.now()
    recovered = 0
    with transaction.atomic(using=settings.DATABASE):
        for run_id, queue in runs.orphans(now, settings.TIMER_BATCH_SIZE):
            error = recovery_exhausted(settings.MAX_RECOVERY_ATTEMPTS + 1)
            outcome = runs.recover(run_id, now, settings.MAX_RECOVERY_ATTEMPTS, error)
            if outcome == "suspended":
                dispatch.advance(run_id, queue)
            recovered += outcome is not None
    return recovered
