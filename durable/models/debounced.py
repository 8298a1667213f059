"""Runs that gather ``durable.debounce`` calls. While one waits (pending and not admitted, so no
turn can claim it and no timer pass takes it), each call for its key replaces its input and puts
its start later; once its start is due, the timer pass admits it and it runs like any run.

Admitting is the one guarded UPDATE a call and the timer pass race for: a call that locks the row
first moves its start, and the pass then finds it no longer due; a call that comes after finds
no waiting run and begins a new debounce.

Calls for one key take turns: on PostgreSQL each call's transaction first takes an advisory lock
on the key (in ``gathering``), so a second call finds the run the first one inserted. (A unique index
did this before; the run table is partitioned by id on PostgreSQL, where an index unique across
partitions must hold the id.) SQLite's transactions take the write lock when they begin.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections, models

from . import offloads
from .base import Status

#: A run still gathering calls: not admitted to run yet.
WAITING = {"status": Status.PENDING, "admitted": False}
#: The first key of durable's advisory locks for debounce keys (the second is the key's hash),
#: apart from the single-key locks an application may take.
_LOCK_SPACE = 0x64756462  # "dudb"


class DebouncedRuns(models.QuerySet[Any]):
    """The run queryset's statements for debounced runs."""

    def gathering(self, namespace: str, workflow: str, key: str) -> Any:
        """The run that gathers calls for ``key``, its row locked until the caller's transaction
        ends, or None; the key's turn taken first (see the module's docstring), so a None
        holds until the caller inserted the run or its transaction ended."""
        connection = connections[self.db]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                # A hash collision makes two keys take turns, nothing worse.
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                    [_LOCK_SPACE, "\x1f".join((namespace, workflow, key))],
                )
        waiting = self.filter(namespace=namespace, workflow=workflow, debounce_key=key, **WAITING)
        return waiting.select_for_update().only("id", "created_at").first()

    def put_off(
        self, run_id: str, stored_input: Any, start_at: datetime, deadline: Any, now: datetime
    ) -> bool:
        """Give a waiting run the input of the latest call and its new start (its row locked by
        ``gathering``); the object of an offloaded input it replaces goes once this commits."""
        waiting = self.filter(id=run_id, **WAITING)
        offloads.release(waiting, ["input"])
        return bool(waiting.update(input=stored_input, wake_at=start_at, deadline=deadline, updated_at=now))

    def admit_debounced(self, now: datetime, limit: int) -> int:
        """Admit up to ``limit`` waiting runs whose start is due; the timer pass then takes them
        like any run due (their ``wake_at`` is past)."""
        due = self.filter(debounce_key__isnull=False, wake_at__lte=now, **WAITING).order_by("wake_at")
        ids = list(due.values_list("id", flat=True)[:limit])
        if not ids:
            return 0
        admitted: int = self.filter(id__in=ids, wake_at__lte=now, **WAITING).update(
            admitted=True, updated_at=now
        )
        return admitted
