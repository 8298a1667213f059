"""Events: ``publish_event`` stores an event and wakes the runs waiting for it.

A wait and a publish may cross: a turn looks for the event before the publish commits, and the
publish looks for waiters before the turn's wait commits. Each side therefore asks about the
other only after its own write has committed (the publisher in an on-commit hook, the turn after
its settle), so at least one of them sees the other and the run is woken.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from .. import clock, conf
from ..models import Checkpoint, Event
from ..replay.history import PENDING, Record
from ..replay.waits import check_match, received_events
from . import lifecycle


def publish(name: str, payload: Any) -> None:
    """Store event ``name``; the runs waiting for it are woken once it has committed."""
    settings = conf.get()
    with transaction.atomic(using=settings.DATABASE):
        Event.objects.using(settings.DATABASE).create(name=name, payload=payload, created_at=clock.now())
        transaction.on_commit(lambda: wake_waiters(name, payload), using=settings.DATABASE)


#: Waits read per statement when an event wakes its waiters.
WAITS_PER_READ = 500


def wake_waiters(name: str, payload: Any) -> int:
    """Wake the runs with a pending wait for ``name`` whose match this payload fits."""
    settings = conf.get()
    waits = Checkpoint.objects.using(settings.DATABASE).filter(kind="event", name=name, status=PENDING)
    woken, after = 0, 0
    while True:
        # Read a batch at a time by id, not through a server-side cursor (``iterator()``): one
        # does not survive a pooler in transaction mode, where each FETCH may reach another
        # server session than the DECLARE did.
        batch = list(
            waits.filter(id__gt=after).order_by("id").values_list("id", "run_id", "input")[:WAITS_PER_READ]
        )
        for _, run_id, wait in batch:
            if fits(payload, check_match((wait or {}).get("match"))):
                lifecycle.wake(run_id)
                woken += 1
        if len(batch) < WAITS_PER_READ:
            return woken
        after = batch[-1][0]


def fits(payload: Any, match: dict[str, Any] | None) -> bool:
    if not match:
        return True
    return isinstance(payload, dict) and all(k in payload and payload[k] == v for k, v in match.items())


def find(
    name: str, match: dict[str, Any] | None, since: datetime, exclude: set[int]
) -> tuple[int, Any] | None:
    return Event.objects.using(conf.get().DATABASE).oldest_match(name, match, since, exclude)


def arrived_since(records: dict[int, Record]) -> bool:
    """Whether an event that one of these pending waits would take is there (asked after the
    turn's commit, for an event published while the turn ran)."""
    waits = [rec for rec in records.values() if rec.kind == "event" and rec.status == PENDING]
    if not waits:
        return False
    since = clock.now() - conf.get().EVENT_BUFFER_TTL
    received = received_events(records)
    return any(find(rec.name, (rec.input or {}).get("match"), since, received) for rec in waits)
