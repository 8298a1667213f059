"""Who serves durable, as last seen: workers (their queues and workflows) and sweeps (their last
pass). Written cheaply (one UPDATE per beat), read by the run diagnosis and the health page."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, models, transaction

from .base import commit_without_waiting


class PresenceQuerySet(models.QuerySet["Presence"]):
    def seen(self, kind: str, who: str, now: datetime, **fields: Any) -> None:
        """Note that ``who`` is alive now (one UPDATE; an INSERT the first time)."""
        connection = connections[self.db]
        if connection.vendor == "postgresql" and not connection.in_atomic_block:
            # A heartbeat lost in a crash is harmless: its commit need not wait for the disk
            # (measured: a note then costs about 40% less).
            with transaction.atomic(using=self.db):
                commit_without_waiting(self.db)
                updated = self.filter(kind=kind, who=who).update(last_seen=now, **fields)
        else:
            updated = self.filter(kind=kind, who=who).update(last_seen=now, **fields)
        if updated:
            return
        try:
            with transaction.atomic(using=self.db):
                self.create(kind=kind, who=who, last_seen=now, started_at=now, **fields)
        except IntegrityError:
            # Another process of the same name wrote first: its row is as good as ours.
            self.filter(kind=kind, who=who).update(last_seen=now, **fields)

    def live(self, kind: str, since: datetime) -> PresenceQuerySet:
        seen: PresenceQuerySet = self.filter(kind=kind, last_seen__gte=since)
        return seen

    def prune(self, before: datetime) -> int:
        """Forget what was last seen before ``before`` (stopped workers, sweeps no longer run)."""
        deleted: int = self.filter(last_seen__lt=before).delete()[0]
        return deleted


class Presence(models.Model):
    """A worker process or a sweep, as last seen."""

    WORKER = "worker"
    SWEEP = "sweep"

    kind = models.CharField(max_length=16)
    #: A worker's Celery node name and pid; a sweep's task name (and namespace).
    who = models.CharField(max_length=255)
    #: The queues a worker consumes, and the workflows it has registered as ``name@version``.
    queues = models.JSONField(default=list, blank=True)
    workflows = models.JSONField(default=list, blank=True)
    #: A sweep's last pass: what it did.
    detail = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)

    objects = PresenceQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "who"], name="durable_presence_who")]
        ordering = ["kind", "who"]
        verbose_name = "worker and sweep"
        verbose_name_plural = "health"

    def __str__(self) -> str:
        return f"{self.kind} {self.who}"
