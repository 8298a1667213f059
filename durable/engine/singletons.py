"""Singleton workflows: at most ``limit`` runs per key hold a slot; the others wait, pending and
unclaimable, by priority then start order, and get the slots as they free up. Workflows with
``concurrency=`` wait in the same kind of line, and so do the runs of a lane, under a key scoped
by the lane (``lane:<name>:<key>``) whose slot row keeps the lane's limit.

The key's slot row is locked while its slots are counted, so two starts never both take the last
one; a slot is handed on in the transaction that finishes the run holding it.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Count, F

from .. import clock, conf, dispatch
from ..definitions import Workflow, registry
from ..errors import QueueFull, WorkflowNotRegistered
from ..limits import Lane
from ..models import UNFINISHED, Run, SingletonSlot

#: Keys with waiting runs one sweep looks at.
REPAIR_BATCH = 100


def place(
    definition: Workflow, input: Any, *, queue_limit: bool = True, lane: Lane | None = None
) -> dict[str, Any]:
    """The fields that put a new run of ``definition`` in its key's line (none for other
    workflows), or in ``lane``'s line (its declared one by default). Call in the transaction
    that inserts the run, then ``admit(key, ...)``."""
    lane = lane or definition.lane
    spec = lane.line() if lane is not None else definition.singleton
    if spec is None:
        return {}
    scope = f"lane:{lane.name}" if lane is not None else definition.name
    key = f"{scope}:{spec.key_for(input)}"
    slot = _lock(key)
    if lane is not None and slot.limit != spec.limit:
        SingletonSlot.objects.using(conf.get().DATABASE).filter(key=key).update(limit=spec.limit)
    unfinished = (
        Run.objects.using(conf.get().DATABASE).filter(singleton_key=key, status__in=UNFINISHED).count()
    )
    if queue_limit and spec.max_queue_depth is not None and unfinished >= spec.limit + spec.max_queue_depth:
        raise QueueFull(
            f"singleton key {key!r} already has {unfinished} unfinished runs (limit {spec.limit} + "
            f"max_queue_depth {spec.max_queue_depth}); nothing was started",
            details={"key": key, "unfinished": unfinished},
        )
    return {"singleton_key": key, "singleton_seq": _next_seq(slot), "admitted": False}


def requeue(run: Run) -> None:
    """Put a run that runs again (a retry) at the back of its key's line, then admit who can go."""
    assert run.singleton_key is not None
    seq = _next_seq(_lock(run.singleton_key))
    Run.objects.using(conf.get().DATABASE).filter(id=run.id).update(
        admitted=False, singleton_seq=seq, wake_at=None
    )
    admit(run.singleton_key, run.workflow)


def admit(key: str, workflow: str) -> list[str]:
    """Give the key's free slots to its oldest waiting runs and send each a turn (on commit)."""
    settings = conf.get()
    with transaction.atomic(using=settings.DATABASE):  # the caller's, when it has one
        return _admit(key, workflow, settings)


def _admit(key: str, workflow: str, settings: conf.Settings) -> list[str]:
    runs = Run.objects.using(settings.DATABASE)
    slot = _lock(key)
    line = runs.filter(singleton_key=key, status__in=UNFINISHED)
    free = (slot.limit or _limit(workflow)) - line.filter(admitted=True).count()
    if free <= 0:
        return []
    now = clock.now()
    admitted = []
    for run_id, queue, wake_at in (
        line.filter(admitted=False)
        .order_by("-priority", "singleton_seq")
        .values_list("id", "queue", "wake_at")[:free]
    ):
        delayed = wake_at is not None and wake_at > now  # started with a delay not yet over
        runs.filter(id=run_id, admitted=False).update(
            admitted=True, wake_at=wake_at if delayed else now + settings.RECONCILE_INTERVAL, updated_at=now
        )
        if not delayed:
            dispatch.advance(run_id, queue)
        admitted.append(run_id)
    return admitted


def repair() -> int:
    """Admit waiting runs whose key has free slots, e.g. after a deploy raised its limit.

    Two reads when nothing is to be done: the keys with waiting runs, and their runs in flight."""
    runs = Run.objects.using(conf.get().DATABASE)
    waiting = dict(
        runs.filter(admitted=False, singleton_key__isnull=False, status__in=UNFINISHED)
        .order_by()
        .values_list("singleton_key", "workflow")
        .distinct()[:REPAIR_BATCH]
    )
    if not waiting:
        return 0
    in_flight = dict(
        runs.filter(singleton_key__in=list(waiting), admitted=True, status__in=UNFINISHED)
        .order_by()
        .values_list("singleton_key")
        .annotate(n=Count("id"))
    )
    slots = SingletonSlot.objects.using(conf.get().DATABASE)
    lanes = dict(slots.filter(key__in=list(waiting), limit__isnull=False).values_list("key", "limit"))
    return sum(
        len(admit(key, workflow))
        for key, workflow in waiting.items()
        if in_flight.get(key, 0) < (lanes.get(key) or _limit(workflow))
    )


def _limit(workflow: str) -> int:
    try:
        spec = registry.workflow(workflow).singleton
    except WorkflowNotRegistered:
        return 0  # this process lacks the code: leave the line for one that has it
    return spec.limit if spec is not None else 1_000_000_000  # no longer a singleton: admit them all


def _next_seq(slot: SingletonSlot) -> int:
    """The next place in the line of ``slot``'s key (its row locked by the caller)."""
    SingletonSlot.objects.using(conf.get().DATABASE).filter(key=slot.key).update(next_seq=F("next_seq") + 1)
    return slot.next_seq + 1


def _lock(key: str) -> SingletonSlot:
    slots = SingletonSlot.objects.using(conf.get().DATABASE)
    slots.get_or_create(key=key)
    return slots.select_for_update().get(key=key)
