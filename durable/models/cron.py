"""Persisted cron schedules, and the per-key counters of singleton workflows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models

from .base import skip_locked
from .payloads import PayloadField


class CronScheduleQuerySet(models.QuerySet["CronSchedule"]):
    def serving(self, namespace: str | None) -> CronScheduleQuerySet:
        """The schedules of ``namespace``; all of them when None."""
        return self if not namespace else self.filter(namespace=namespace)

    def due(self, now: datetime, limit: int) -> list[CronSchedule]:
        """Unpaused schedules whose next tick has come, oldest first."""
        qs = self.filter(paused=False, next_at__lte=now).order_by("next_at")
        return list(skip_locked(qs)[:limit])

    def advance(self, key: str, tick: datetime, next_at: datetime, run_id: str | None, now: datetime) -> bool:
        """Move past ``tick`` (noting the run it started); False if another sweep already did."""
        fields: dict[str, Any] = {"next_at": next_at, "updated_at": now}
        if run_id is not None:
            fields["last_run_id"] = run_id
        return bool(self.filter(key=key, next_at=tick, paused=False).update(**fields))

    def pause(self, key: str, now: datetime) -> bool:
        return bool(self.filter(key=key, paused=False).update(paused=True, updated_at=now))

    def resume(self, key: str, next_at: datetime, now: datetime) -> bool:
        """Unpause; the next tick is counted from now, so ticks missed while paused never run."""
        return bool(self.filter(key=key, paused=True).update(paused=False, next_at=next_at, updated_at=now))


class CronSchedule(models.Model):
    """A persisted cron schedule: each tick starts one run, id ``schedule:<key>:<tick>``.

    (``durable.Schedule`` is the declaration in code; this row is what the sweep keeps.)
    """

    key = models.CharField(primary_key=True, max_length=200)
    workflow = models.CharField(max_length=200)
    input = PayloadField(null=True, blank=True)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    #: "skip": a tick that finds the previous run unfinished starts nothing; "allow": it starts anyway.
    overlap = models.CharField(max_length=16, default="skip")
    paused = models.BooleanField(default=False)
    next_at = models.DateTimeField()
    last_run_id = models.CharField(max_length=255, null=True, blank=True)
    #: Declared by ``@durable.workflow(schedule=...)``: kept in step with the code at each sweep.
    declared = models.BooleanField(default=False)
    #: The namespace of the runs it starts; only a beat of that namespace (or of all) fires it.
    namespace = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = CronScheduleQuerySet.as_manager()

    class Meta:
        db_table = "durable_schedule"
        verbose_name = "schedule"
        verbose_name_plural = "schedules"
        indexes = [models.Index(fields=["paused", "next_at"], name="durable_schedule_due")]

    def __str__(self) -> str:
        return f"schedule {self.key} ({self.cron} {self.timezone})"


class SingletonSlot(models.Model):
    """One row per singleton key: locked while the key's slots are counted, so two starts
    cannot both take the last one; ``next_seq`` numbers the key's runs in start order."""

    key = models.CharField(primary_key=True, max_length=255)
    next_seq = models.BigIntegerField(default=0)
    #: A lane's key keeps the lane's concurrency here, so whichever process admits its runs
    #: knows the limit without the code that declared the lane (None: the workflow's own).
    limit = models.IntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"singleton {self.key}"
