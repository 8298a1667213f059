"""Runs whose turn died holding its lease, taken back by the orphan sweep, and runs a turn gives
back when it ran past its time limit: both counted against the run's recovery budget."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections, models
from django.db.models import F

from ..statuses import CheckpointStatus
from .base import Status, batch_of, referring, skip_locked


class OrphanedRuns(models.QuerySet[Any]):
    """The run queryset's statements for turns that will not finish."""

    def take_orphans(
        self,
        now: datetime,
        limit: int,
        max_attempts: int,
        error: dict[str, Any],
        *,
        stale_before: datetime | None = None,
        owner_prefix: str | None = None,
    ) -> dict[str, list[tuple[str, str]]]:
        """Take back up to ``limit`` runs whose turn died holding its lease, in one statement, and
        say what became of each (id, queue): ``parked`` (a dispatched step is still in flight, so
        the dead turn is not counted as a crash), ``dead`` (the recovery budget is spent),
        ``suspended`` (counted, due at once). Rows a concurrent sweep or a turn holds are
        skipped, and a row a turn took back meanwhile no longer matches when it is locked.
        """
        Checkpoint = referring(self, "checkpoints")

        cutoff = stale_before or now
        qs = self.filter(status=Status.RUNNING, locked_until__lt=cutoff)
        if owner_prefix is not None:
            qs = qs.filter(locked_by__startswith=owner_prefix)
        connection = connections[self.db]
        ops = connection.ops
        at = ops.adapt_datetimefield_value
        table = ops.quote_name(self.model._meta.db_table)
        # A dispatched step in flight, or one the dead turn was running in place (its death is
        # the step's, counted against the step's retries as a lost attempt, not the run's).
        # Read once per run in a CTE that every SET expression reads: written in each of them,
        # it was planned six times over every partition of a partitioned history.
        parked = (
            f"EXISTS (SELECT 1 FROM {ops.quote_name(Checkpoint._meta.db_table)} c WHERE c.run_id = {{run}} "
            f"AND c.kind = 'step' AND c.status = '{CheckpointStatus.PENDING}' "
            "AND (c.enqueued_at IS NOT NULL OR c.started_at IS NOT NULL))"
        )
        batch, params = batch_of(skip_locked(qs).values("id")[:limit])
        flight = (
            f"flight AS MATERIALIZED (SELECT id AS run, {parked.format(run='batch.id')} AS parked FROM batch)"
        )
        # SQLite's RETURNING cannot read a table of the FROM clause.
        returned = "flight.parked" if connection.vendor == "postgresql" else parked.format(run=f"{table}.id")
        dead = "(NOT flight.parked AND recovery_attempts >= %s)"
        # Every SET expression reads the row as it was, so each one states the case in full.
        sql = (
            f"{batch}, {flight} UPDATE {table} SET "
            f"status = CASE WHEN {dead} THEN %s ELSE %s END, "
            "recovery_attempts = CASE WHEN flight.parked OR recovery_attempts >= %s THEN recovery_attempts "
            "ELSE recovery_attempts + 1 END, "
            f"error = CASE WHEN {dead} THEN %s ELSE error END, "
            f"wake_at = CASE WHEN {dead} THEN NULL ELSE %s END, "
            f"finished_at = CASE WHEN {dead} THEN %s ELSE finished_at END, "
            "locked_by = NULL, locked_until = NULL, updated_at = %s "
            f"FROM flight WHERE {table}.id = flight.run "
            f"RETURNING id, queue, status, {returned}"
        )
        stamp = at(now)
        error_value = self.model._meta.get_field("error").get_db_prep_save(error, connection)
        sql_params = [
            *params,
            *(max_attempts, Status.DEAD, Status.SUSPENDED),
            max_attempts,
            *(max_attempts, error_value),
            *(max_attempts, stamp),
            *(max_attempts, stamp),
            stamp,
        ]
        outcome: dict[str, list[tuple[str, str]]] = {"parked": [], Status.DEAD: [], Status.SUSPENDED: []}
        with connection.cursor() as cursor:
            cursor.execute(sql, sql_params)
            for run_id, queue, status, in_flight in cursor.fetchall():
                outcome["parked" if in_flight else status].append((run_id, queue))
        # The dead turn may have committed sends it never published: the next turn sends again.
        Checkpoint.objects.using(self.db).unsend([run_id for run_id, _ in outcome["parked"]])
        return outcome

    def give_back(
        self, run_id: str, owner: str, now: datetime, max_attempts: int, error: dict[str, Any]
    ) -> str | None:
        """Hand back a run whose turn this owner abandons (it ran past its time limit), counted
        as a crashed turn: ``dead`` with ``error`` once the recovery budget is spent (as
        ``recover`` decides), else ``suspended`` and due at once. None if the lease is not held.
        """
        held = self.filter(id=run_id, locked_by=owner, status=Status.RUNNING)
        released = {"locked_by": None, "locked_until": None, "updated_at": now}
        if held.filter(recovery_attempts__gte=max_attempts).update(
            status=Status.DEAD, error=error, wake_at=None, finished_at=now, **released
        ):
            return str(Status.DEAD)
        if held.update(
            status=Status.SUSPENDED, recovery_attempts=F("recovery_attempts") + 1, wake_at=now, **released
        ):
            return str(Status.SUSPENDED)
        return None
