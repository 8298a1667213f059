"""Runs parked by non-determinism (ON_NONDETERMINISM "park"): a turn whose body asked for other
than its history holds writes nothing of itself and leaves the run suspended, retried with a
backoff and at every worker start, until code that replays the history is deployed.

The run is not failed, since nothing is wrong with it: the code is. It is not counted as a crash
either (the turn ended, it did not die), so it never goes ``dead`` for it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from .. import clock, conf, dispatch
from ..definitions import registry
from ..errors import NON_DETERMINISM_CAUSES, NON_DETERMINISM_REMEDY
from ..models import Run
from ..models.blocked import NON_DETERMINISM
from ..replay.history import Decision
from ..replay.turnstate import TurnState
from . import observe, turn_writes
from .turn_writes import _Stale

log = logging.getLogger("durable.engine")

#: A parked run's first retry comes this long after it parked; each next one twice as late as
#: the one before, up to RECONCILE_INTERVAL.
FIRST_RETRY = timedelta(seconds=5)
#: A starting worker sends a turn to at most this many batches of TIMER_BATCH_SIZE parked runs;
#: the backoff's timers bring any further ones.
RESUME_BATCHES = 20


def park(run: Run, owner: str, outcome: Decision, state: TurnState, settings: conf.Settings) -> None:
    """End a turn whose body asked for other than its history holds (``outcome.blocked``): write
    nothing of it and park the run; raise _Stale if a wake landed since the turn read the run."""
    db = settings.DATABASE
    # Attempts run in place ended whatever the body does next, as for a turn a wake refused.
    turn_writes.keep_held_results(run.id, owner, state, db)
    now = clock.now()
    error = blocked_error(run, outcome.error or {}, now)
    wake_at = now + retry_after(error["details"]["parked"], settings)
    if run.deadline is not None:
        wake_at = min(wake_at, run.deadline)  # the run still times out when it has a timeout
    if not Run.objects.using(db).park(run.id, owner, run.wakes, now, wake_at, error):
        raise _Stale()
    observe.run_blocked(run, error, wake_at, describe(error))


def blocked_error(run: Run, error: dict[str, Any], now: datetime) -> dict[str, Any]:
    """``error`` with how long the run has been parked: how many turns and since when."""
    before = (run.error or {}).get("details") or {} if is_blocked(run.error) else {}
    details = dict(error.get("details") or {})
    details["parked"] = int(before.get("parked") or 0) + 1
    details["parked_since"] = before.get("parked_since") or now.isoformat()
    return {**error, "details": details}


def retry_after(parked: int, settings: conf.Settings) -> timedelta:
    """How long after its ``parked``-th blocked turn a parked run is tried again."""
    return min(FIRST_RETRY * 2 ** min(parked - 1, 20), settings.RECONCILE_INTERVAL)


def is_blocked(error: dict[str, Any] | None) -> bool:
    """Whether an unfinished run's ``error`` marks it parked by non-determinism."""
    return isinstance(error, dict) and error.get("code") == NON_DETERMINISM


def describe(error: dict[str, Any] | None) -> str:
    """What an operator reads of a parked run: where, what the history holds and what the code
    asked for, the usual causes and the remedy."""
    details = (error or {}).get("details") or {}
    recorded = " ".join(str(part) for part in details.get("recorded") or ()) or "?"
    requested = " ".join(str(part) for part in details.get("requested") or ()) or "?"
    since = details.get("parked_since")
    tries = f" (tried {details['parked']} time(s) since {since})" if since and details.get("parked") else ""
    return (
        f"blocked by non-determinism at position {details.get('seq', '?')}: the history holds "
        f"{recorded}, the code asked for {requested}{tries}. Usual causes: {NON_DETERMINISM_CAUSES}. "
        f"Fix: {NON_DETERMINISM_REMEDY}; deploy the fix and the run resumes by itself"
    )


def resume_registered(settings: conf.Settings) -> int:
    """Send a turn to the parked runs of every workflow version registered in this process (a
    worker that starts may carry the fix); return how many. Bounded batches, each committed
    with its sends; the timer sweep re-sends a run whose message is lost."""
    versions = [(name, version) for name, by_version in registry.workflows.items() for version in by_version]
    runs = Run.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
    sent, after = 0, ""
    for _ in range(RESUME_BATCHES):
        redrive_at = clock.now() + settings.LEASE
        with transaction.atomic(using=settings.DATABASE):
            taken = runs.take_blocked(versions, after, redrive_at, settings.TIMER_BATCH_SIZE)
            dispatch.advance_many(taken)
        sent += len(taken)
        if len(taken) < settings.TIMER_BATCH_SIZE:
            break
        after = taken[-1][0]
    if sent:
        log.info("durable: sent a turn to %d run(s) parked by non-determinism", sent)
    return sent


#: Parked runs ``manage.py durable replay`` names at most.
PARKED_LISTED = 10_000


def parked_among(runs: Any) -> dict[str, dict[str, Any]]:
    """The runs of the queryset ``runs`` parked by non-determinism now: their errors, by id."""
    return dict(runs.blocked().order_by("id").values_list("id", "error")[:PARKED_LISTED])
