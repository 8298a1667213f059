"""The health page's lanes: for each lane this process's steps or workflows name, its slots held
and members waiting (attempts or runs, over all its keys) and its starts in the current rate
window. A bounded number of keys is read per lane, one statement each for the slots, the
waiting and the starts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q, Sum

from durable.limits import declared_lanes
from durable.models import HELD, UNFINISHED, Checkpoint, FlowGate, FlowStart, Run, SingletonSlot
from durable.statuses import CheckpointStatus

#: Keys of one lane the page counts over (a lane per tenant may have many: the rest are left out).
KEYS_SHOWN = 1000


def lane_figures(db: str, now: datetime) -> list[dict[str, Any]]:
    figures = []
    for lane, member in declared_lanes():
        row: dict[str, Any] = {"lane": lane, "member": member, "keys": 0, "held": None, "waiting": None}
        row["started"] = None
        if member == "runs":
            slots = SingletonSlot.objects.using(db).filter(key__startswith=f"lane:{lane.name}:")
            keys = list(slots.values_list("key", flat=True)[:KEYS_SHOWN])
            unfinished = Run.objects.using(db).filter(singleton_key__in=keys, status__in=UNFINISHED)
            row["keys"] = len(keys)
            row["held"] = unfinished.filter(admitted=True).count()
            row["waiting"] = unfinished.filter(admitted=False).count()
        elif lane.concurrency is not None:
            gates = FlowGate.objects.using(db).filter(key__startswith=f"c:lane:{lane.name}:")
            keys = list(gates.values_list("key", flat=True)[:KEYS_SHOWN])
            row["keys"] = len(keys)
            row["waiting"] = gates.filter(key__in=keys).aggregate(n=Sum("waiting"))["n"] or 0
            row["held"] = (
                Checkpoint.objects.using(db)
                .filter(Q(held_until__isnull=True) | Q(held_until__gte=now))
                .filter(flow_key__in=keys, flow=HELD, status=CheckpointStatus.PENDING)
                .filter(run_id__in=Run.objects.using(db).filter(status__in=UNFINISHED).values("id"))
                .count()
            )
        if lane.rate_limit is not None:
            row["started"] = (
                FlowStart.objects.using(db)
                .filter(key__startswith=f"r:lane:{lane.name}", at__gt=now - lane.rate_limit.period)
                .count()
            )
        figures.append(row)
    return figures
