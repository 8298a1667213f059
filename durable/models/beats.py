"""What an attempt's executor reports while it runs: that it is alive (its last beat, and who
holds it until when) and how far it got (its progress). None of these writes moves a position's
status; every write that does is in ``checkpoints``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from django.db import models
from django.db.models import Q, Value
from django.db.models.functions import Coalesce

from ..statuses import CheckpointStatus
from .base import BEAT_HOLDER, update_where

#: The position model (``checkpoints.Checkpoint``, which imports this module).
_Position = TypeVar("_Position", bound=models.Model)


def _sent_no_later(sent_at: datetime | None) -> Q:
    """The rows whose kept progress came from no beat sent after ``sent_at`` (None: a sender
    that does not say when, whose beats are kept as they come)."""
    if sent_at is None:
        return Q()
    return Q(progress_at__isnull=True) | Q(progress_at__lte=sent_at)


class Beats(models.QuerySet[_Position]):
    """Mixed into ``CheckpointQuerySet``."""

    def _attempt(self, run_id: str, seq: int, attempt: int) -> models.QuerySet[_Position]:
        return self.filter(run_id=run_id, seq=seq, status=CheckpointStatus.PENDING, attempt=attempt)

    def beat(
        self, run_id: str, seq: int, attempt: int, now: datetime, progress: Any, with_progress: bool
    ) -> bool:
        fields: dict[str, Any] = {"last_heartbeat_at": now}
        if with_progress:
            fields["progress"] = progress
        return bool(self._attempt(run_id, seq, attempt).update(**fields))

    def beat_from_message(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        token: str | None,
        now: datetime,
        until: datetime,
        progress: Any,
        with_progress: bool,
        sent_at: datetime | None = None,
    ) -> bool:
        """A beat sent as a message for this attempt: it started (if not marked yet), is alive,
        and is held by no process here but by its beats, until ``until``. Its progress is kept
        unless a beat sent after it (``sent_at``) was kept already."""
        fields: dict[str, Any] = {
            "started_at": Coalesce("started_at", Value(now, output_field=models.DateTimeField())),
            "last_heartbeat_at": now,
            "held_by": BEAT_HOLDER,
            "held_until": until,
        }
        if not token:  # an attempt between two sends has none: ``token=None`` would match it
            return False
        rows = self._attempt(run_id, seq, attempt).filter(token=token)
        if with_progress and rows.filter(_sent_no_later(sent_at)).update(
            **fields, progress=progress, progress_at=sent_at
        ):
            return True
        return bool(rows.update(**fields))  # alive all the same; its progress is older news

    def late_progress(
        self, run_id: str, seq: int, attempt: int, token: str, progress: Any, sent_at: datetime | None = None
    ) -> bool:
        """Keep ``progress`` from a beat of this attempt that arrived after its result was recorded
        (only with the attempt's token; a later attempt's row no longer matches), unless a beat
        sent after it was kept already."""
        if not token:
            return False
        ended = (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED)
        rows = self.filter(run_id=run_id, seq=seq, attempt=attempt, token=token, status__in=ended)
        return bool(rows.filter(_sent_no_later(sent_at)).update(progress=progress, progress_at=sent_at))

    def beat_later(
        self, run_id: str, seq: int, attempt: int, token: str, now: datetime, progress: Any = None
    ) -> bool:
        """A beat from outside for an attempt let go to complete later (``heartbeat_step``): its
        last beat, and its progress when given, on the attempt still open under that token."""
        fields: dict[str, Any] = {"last_heartbeat_at": now}
        if progress is not None:
            fields["progress"] = progress
        where = {
            "run": run_id,
            "seq": seq,
            "status": CheckpointStatus.PENDING,
            "attempt": attempt,
            "token": token,
        }
        return update_where(self.model, self.db, fields, where) == 1
