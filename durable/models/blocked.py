"""Runs parked by non-determinism: their marker, the guarded write that parks one, and the
queries that find them (the admin's filter, a starting worker's resend).

A parked run is ``suspended`` with a wake like any waiting run; what marks it is its ``error``,
a NonDeterminismError's (code ``non_determinism``), which no other unfinished run carries: every
settle of a turn that gets past the position clears it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q

from ..errors import ErrorCode
from ..statuses import UNFINISHED, RunStatus
from .base import update_where

#: The error code of a run parked by non-determinism (``NonDeterminismError.default_code``).
NON_DETERMINISM = ErrorCode.NON_DETERMINISM


class BlockedRuns(models.QuerySet[Any]):
    """The run queryset's verbs and queries for runs parked by non-determinism."""

    def blocked(self) -> models.QuerySet[Any]:
        """Unfinished runs whose last turn found non-determinism (parked, or in a turn now)."""
        return self.filter(status__in=UNFINISHED, error__code=NON_DETERMINISM)

    def park(
        self, run_id: str, owner: str, wakes: int, now: datetime, wake_at: datetime, error: dict[str, Any]
    ) -> bool:
        """End a turn that found non-determinism with nothing of it written: the run is
        ``suspended`` until ``wake_at`` with ``error``, its lease released. A turn that ends is
        no crash, so the recovery budget starts again as after any settle. Refused (False) when
        the lease was lost or a wake arrived since the turn read the run (it replays instead)."""
        fields = {
            "status": RunStatus.SUSPENDED,
            "error": error,
            "wake_at": wake_at,
            "recovery_attempts": 0,
            "locked_by": None,
            "locked_until": None,
            "updated_at": now,
        }
        where = {"id": run_id, "locked_by": owner, "wakes": wakes, "status": RunStatus.RUNNING}
        return update_where(self.model, self.db, fields, where) == 1

    def take_blocked(
        self, versions: list[tuple[str, str]], after: str, redrive_at: datetime, limit: int
    ) -> list[tuple[str, str]]:
        """Take up to ``limit`` parked runs of these (workflow, version) pairs, by id past
        ``after``, for a turn now (a worker that starts with new code sends them one): their
        next try moves to ``redrive_at``, when the timer sweep sends it again if the message is
        lost. Return their (id, queue)."""
        if not versions:
            return []
        match = Q()
        for workflow, version in versions:
            match |= Q(workflow=workflow, version=version)
        waiting = self.blocked().filter(match, status=RunStatus.SUSPENDED, id__gt=after)
        found = list(waiting.order_by("id").values_list("id", "queue")[:limit])
        # Guarded: a run a turn claimed meanwhile is running, and keeps the timer it settles with.
        self.filter(id__in=[run_id for run_id, _ in found], status=RunStatus.SUSPENDED).update(
            wake_at=redrive_at
        )
        return found
