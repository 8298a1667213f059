"""The gates of fleet-wide step limits, and the starts a rate limit counts.

A step attempt's place under a limit lives on its Checkpoint (``flow``, ``flow_key``,
``flow_seq``); the gate row is locked while a key's slots are counted, as a SingletonSlot is.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import F, Q

from ..statuses import UNFINISHED, CheckpointStatus
from .checkpoints import HELD, WAITING, Checkpoint
from .runs import Run


class FlowGateQuerySet(models.QuerySet["FlowGate"]):
    def lock(self, key: str) -> FlowGate:
        """The gate of ``key``, locked until the transaction ends (created on first use)."""
        self.get_or_create(key=key)
        return self.select_for_update().get(key=key)

    def next_seq(self, gate: FlowGate) -> int:
        """The next place in the line of ``gate`` (its row locked by the caller)."""
        self.filter(key=gate.key).update(next_seq=F("next_seq") + 1)
        gate.next_seq += 1
        return gate.next_seq


class FlowGate(models.Model):
    """One row per limited key (``c:<step>:<key>`` for a concurrency limit, ``r:<step>`` for a
    rate limit): locked while its slots or tokens are counted, so two workers never both take
    the last one; ``next_seq`` numbers the attempts that wait in its line."""

    key = models.CharField(primary_key=True, max_length=255)
    next_seq = models.BigIntegerField(default=0)

    objects = FlowGateQuerySet.as_manager()

    def __str__(self) -> str:
        return f"flow gate {self.key}"


class FlowStartQuerySet(models.QuerySet["FlowStart"]):
    def within(self, key: str, since: datetime) -> list[datetime]:
        """When the starts of ``key`` counted by its window began, oldest first."""
        return list(self.filter(key=key, at__gt=since).order_by("at").values_list("at", flat=True))

    def forget(self, key: str, before: datetime) -> None:
        """Drop the starts no window counts any more."""
        self.filter(key=key, at__lte=before).delete()


class FlowStart(models.Model):
    """One start of a rate-limited step: a rate limit counts these in its sliding window."""

    key = models.CharField(max_length=255)
    at = models.DateTimeField()

    objects = FlowStartQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["key", "at"], name="durable_flowstart_window")]

    def __str__(self) -> str:
        return f"start of {self.key} at {self.at}"


def in_flight(db: str, key: str, now: datetime) -> models.QuerySet[Checkpoint]:
    """The attempts holding a slot of ``key``: pending, in an unfinished run, and not held by a
    process that stopped renewing (its slot comes back when its hold lapses, not later)."""
    return Checkpoint.objects.using(db).filter(
        Q(held_until__isnull=True) | Q(held_until__gte=now),
        flow_key=key,
        flow=HELD,
        status=CheckpointStatus.PENDING,
        run_id__in=Run.objects.using(db).filter(status__in=UNFINISHED).values("id"),
    )


def in_line(db: str, key: str) -> models.QuerySet[Checkpoint]:
    """The attempts waiting for a slot of ``key``, oldest first."""
    return (
        Checkpoint.objects.using(db)
        .filter(
            flow_key=key,
            flow=WAITING,
            status=CheckpointStatus.PENDING,
            run_id__in=Run.objects.using(db).filter(status__in=UNFINISHED).values("id"),
        )
        .order_by("flow_seq")
    )
