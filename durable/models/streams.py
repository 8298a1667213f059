"""Streams: values a run writes under a key (``ctx.write_stream`` in its body, ``durable.write_stream``
in its steps) for readers to follow while it runs (``durable.read_stream``).

Each stream has a head row, locked while a value is appended (by the UPDATE that takes its
position, to the commit): positions are given one after another, in the order their
transactions commit, so a reader that asks for the values past the
last one it saw never skips one committed later under a smaller position. A value is stored once
per writer (the body's position, or a step attempt and its n-th write): a write tried again
after a lost commit answer stores nothing twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections, models, transaction
from django.db.models import F

from .base import insertion
from .payloads import PayloadField

#: What ``append`` found: the value is stored now, was stored before, or the stream is closed.
APPENDED, ALREADY, CLOSED = "appended", "already", "closed"


class StreamHeadQuerySet(models.QuerySet["StreamHead"]):
    def append(
        self, run_id: str, key: str, value: Any, *, seq: int, attempt: int, index: int, now: datetime
    ) -> str:
        """Store ``value`` at the stream's next position (in the caller's transaction, if any).

        Two statements: the head's UPDATE takes the position (and the row's lock, held to the
        commit), the value's INSERT skips a value this writer stored already."""
        with transaction.atomic(using=self.db, savepoint=False):
            position = self._take_position(run_id, key)
            if position is None:
                self._create(run_id, key)
                position = self._take_position(run_id, key)
                if position is None:
                    return CLOSED
            row = StreamValue(
                run_id=run_id,
                key=key,
                position=position,
                value=value,
                seq=seq,
                attempt=attempt,
                index=index,
                written_at=now,
            )
            sql, params = insertion(StreamValue, self.db, [row])
            with connections[self.db].cursor() as cursor:
                cursor.execute(f"{sql} ON CONFLICT DO NOTHING RETURNING id", params)
                if cursor.fetchone() is not None:
                    return APPENDED
            # A try whose commit answer was lost stored it: the position goes back (still ours).
            self.filter(run_id=run_id, key=key).update(next_position=F("next_position") - 1)
            return ALREADY

    def close(self, run_id: str, key: str) -> None:
        """No value is appended to the stream after this (in the caller's transaction)."""
        self._create(run_id, key)
        self.filter(run_id=run_id, key=key).update(closed=True)

    def _take_position(self, run_id: str, key: str) -> int | None:
        """The stream's next position, taken (None: no head yet, or the stream is closed)."""
        table = connections[self.db].ops.quote_name(StreamHead._meta.db_table)
        sql = (
            f"UPDATE {table} SET next_position = next_position + 1 "
            "WHERE run_id = %s AND key = %s AND NOT closed RETURNING next_position"
        )
        with connections[self.db].cursor() as cursor:
            cursor.execute(sql, [run_id, key])
            found = cursor.fetchone()
        return None if found is None else found[0] - 1

    def _create(self, run_id: str, key: str) -> None:
        self.bulk_create([StreamHead(run_id=run_id, key=key)], ignore_conflicts=True)


class StreamHead(models.Model):
    """One row per stream of a run: its next position, and whether the body closed it."""

    run = models.ForeignKey("durable.Run", on_delete=models.CASCADE, db_index=False)
    key = models.CharField(max_length=200)
    next_position = models.BigIntegerField(default=0)
    closed = models.BooleanField(default=False)

    objects = StreamHeadQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="durable_stream_head")]

    def __str__(self) -> str:
        return f"stream {self.key} of {self.run_id}"


class StreamValue(models.Model):
    """One value of a stream, at its position; ``seq`` / ``attempt`` / ``index`` say who wrote it
    (the body's position with attempt 0, or a step's position, its attempt and its n-th write)."""

    run = models.ForeignKey("durable.Run", on_delete=models.CASCADE, db_index=False)
    key = models.CharField(max_length=200)
    position = models.BigIntegerField()
    value = PayloadField(null=True, blank=True)
    seq = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(default=0)
    index = models.PositiveIntegerField(default=0)
    written_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key", "position"], name="durable_stream_value"),
            models.UniqueConstraint(
                fields=["run", "key", "seq", "attempt", "index"], name="durable_stream_once"
            ),
        ]

    def __str__(self) -> str:
        return f"value {self.position} of stream {self.key} of {self.run_id}"
