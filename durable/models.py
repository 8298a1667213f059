"""Durable's rows and their state transitions.

Every transition is one guarded UPDATE whose WHERE names the state it expects; the row count
says who won. Nothing outside this module assigns ``status``.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Exists, F, OuterRef

from .statuses import TERMINAL, UNFINISHED, RunStatus

#: The run statuses as Django choices, built from the one spelling (its members equal RunStatus's).
Status = models.TextChoices("Status", [(status.name, status.value) for status in RunStatus])


#: The ends a retry may undo.
RETRYABLE = (Status.FAILED, Status.DEAD, Status.CANCELLED)


class RunQuerySet(models.QuerySet["Run"]):
    def claim(self, run_id: str, owner: str, now: datetime, lease: timedelta) -> Run | None:
        """Take the turn lease of an unfinished run whose lease is free or expired; return the row.

        Taking over a ``running`` run means its last turn died holding the lease: that counts
        as a recovery attempt. One statement: the UPDATE returns the claimed row.
        """
        ops = connections[self.db].ops
        at = ops.adapt_datetimefield_value
        table = ops.quote_name(Run._meta.db_table)
        sql = (
            f"UPDATE {table} SET "
            "recovery_attempts = CASE WHEN status = %s THEN recovery_attempts + 1 ELSE recovery_attempts END, "
            "status = %s, locked_by = %s, locked_until = %s, started_at = COALESCE(started_at, %s), "
            "updated_at = %s "
            "WHERE id = %s AND status IN (%s, %s, %s) AND (locked_until IS NULL OR locked_until < %s) "
            "AND admitted = %s RETURNING *"
        )
        params = [
            Status.RUNNING, Status.RUNNING, owner, at(now + lease), at(now), at(now),
            run_id, *UNFINISHED, at(now), True,
        ]
        claimed = list(Run.objects.using(self.db).raw(sql, params))
        return claimed[0] if claimed else None

    def renew(self, run_id: str, owner: str, now: datetime, lease: timedelta) -> bool:
        """Extend a lease this owner still holds; False means it was taken over."""
        return bool(
            self.filter(id=run_id, locked_by=owner, status=Status.RUNNING).update(
                locked_until=now + lease
            )
        )

    def settle(self, run_id: str, owner: str, wakes: int, now: datetime, **fields: Any) -> bool:
        """End a turn: write its outcome and release the lease.

        Refused (False) when the lease was lost or a wake arrived since the turn read the run.
        """
        fields.setdefault("recovery_attempts", 0)
        return bool(
            self.filter(id=run_id, locked_by=owner, wakes=wakes, status=Status.RUNNING).update(
                locked_by=None, locked_until=None, updated_at=now, **fields
            )
        )

    def release(self, run_id: str, owner: str, now: datetime, wake_at: datetime) -> bool:
        """Give the lease back without an outcome, so another worker can take the run."""
        return bool(
            self.filter(id=run_id, locked_by=owner, status=Status.RUNNING).update(
                status=Status.SUSPENDED, locked_by=None, locked_until=None, wake_at=wake_at, updated_at=now
            )
        )

    def wake(self, run_id: str, now: datetime, redrive_at: datetime) -> str | None:
        """Note that something happened for an unfinished run; return its queue, or None if it
        has finished. One statement.

        The run's timer is brought forward to ``redrive_at`` at the latest, so the timer sweep
        re-drives it if the message that should carry this wake is lost; a run waiting for its
        singleton slot keeps its own (its start delay), since it cannot run before it is admitted.
        """
        connection = connections[self.db]
        ops = connection.ops
        earliest = "MIN" if connection.vendor == "sqlite" else "LEAST"
        at = ops.adapt_datetimefield_value(redrive_at)
        sql = (
            f"UPDATE {ops.quote_name(Run._meta.db_table)} SET wakes = wakes + 1, "
            f"wake_at = CASE WHEN admitted THEN {earliest}(COALESCE(wake_at, %s), %s) ELSE wake_at END, "
            "updated_at = %s "
            "WHERE id = %s AND status IN (%s, %s, %s) RETURNING queue"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [at, at, ops.adapt_datetimefield_value(now), run_id, *UNFINISHED])
            row = cursor.fetchone()
        return row[0] if row else None

    def end(self, run_id: str, status: str, error: dict[str, Any], now: datetime) -> bool:
        """End an unfinished run from outside its turns (``dead`` or ``cancelled``), lease and all."""
        return bool(
            self.filter(id=run_id, status__in=UNFINISHED).update(
                status=status,
                error=error,
                locked_by=None,
                locked_until=None,
                wake_at=None,
                finished_at=now,
                updated_at=now,
            )
        )

    def request_cancel(self, run_id: str, request: dict[str, Any], now: datetime) -> bool:
        """Record a compensating cancel and wake the run; False if finished or already asked."""
        return bool(
            self.filter(id=run_id, status__in=UNFINISHED, cancel_request__isnull=True).update(
                cancel_request=request, wakes=F("wakes") + 1, wake_at=now, updated_at=now
            )
        )

    def reopen(self, run_id: str, now: datetime) -> bool:
        """Put a failed, dead or cancelled run back in line with a fresh recovery budget."""
        return bool(
            self.filter(id=run_id, status__in=RETRYABLE).update(
                status=Status.PENDING,
                error=None,
                output=None,
                failed_seqs=None,
                cancel_request=None,
                recovery_attempts=0,
                finished_at=None,
                wake_at=now,
                wakes=F("wakes") + 1,
                updated_at=now,
            )
        )

    def start_child(
        self, child: Any, *, parent: Run, now: datetime, queue: str, reconcile: timedelta, **fields: Any
    ) -> bool:
        """Create the child run a parent's turn starts; False if that id already exists."""
        fields.setdefault("wake_at", now + reconcile)
        try:
            with transaction.atomic(using=self.db):
                self.create(
                    id=child.run_id, workflow=child.workflow, version=child.version, queue=queue,
                    input=child.input, parent=parent, parent_seq=child.seq, namespace=parent.namespace,
                    created_at=now, updated_at=now, **fields,
                )
        except IntegrityError:
            return False
        return True

    def due(self, now: datetime, limit: int) -> list[tuple[str, str]]:
        """(id, queue) of waiting runs whose timer (or safety-net wake) is due, oldest first."""
        qs = self.filter(status__in=(Status.PENDING, Status.SUSPENDED), wake_at__lte=now, admitted=True)
        return list(_skip_locked(qs.order_by("wake_at")).values_list("id", "queue")[:limit])

    def push_wake(self, ids: list[str], now: datetime, until: datetime) -> int:
        """Move the timers of runs just woken forward, so the next sweep does not send them again."""
        return self.filter(
            id__in=ids, status__in=(Status.PENDING, Status.SUSPENDED), wake_at__lte=now
        ).update(wake_at=until)

    def orphans(self, now: datetime, limit: int) -> list[tuple[str, str]]:
        """(id, queue) of runs whose turn died holding the lease."""
        qs = self.filter(status=Status.RUNNING, locked_until__lt=now).order_by("locked_until")
        return list(qs.values_list("id", "queue")[:limit])

    def recover(
        self,
        ids: list[str],
        now: datetime,
        max_attempts: int,
        error: dict[str, Any],
        *,
        stale_before: datetime | None = None,
        owner_prefix: str | None = None,
    ) -> dict[str, list[str]]:
        """Take back runs whose turn died holding its lease, a batch at a time; say what became
        of each: ``parked`` (a dispatched step is still in flight, so the dead turn is not
        counted as a crash), ``dead`` (the recovery budget is spent), ``suspended`` (counted,
        due at once). Every UPDATE re-checks the orphan condition, so concurrent sweeps and a
        turn that takes the run back in between are safe.
        """
        orphans = self.filter(id__in=ids, status=Status.RUNNING, locked_until__lt=stale_before or now)
        if owner_prefix is not None:
            orphans = orphans.filter(locked_by__startswith=owner_prefix)
        released = {"locked_by": None, "locked_until": None, "updated_at": now}
        # A dispatched step in flight, or one the dead turn was running in place (its death is
        # the step's, counted against the step's retries as a lost attempt, not the run's).
        in_flight = Checkpoint.objects.filter(run_id=OuterRef("id"), kind="step", status="pending").filter(
            models.Q(enqueued_at__isnull=False) | models.Q(started_at__isnull=False)
        )
        parked = list(orphans.filter(Exists(in_flight)).values_list("id", flat=True))
        orphans.filter(id__in=parked).update(status=Status.SUSPENDED, wake_at=now, **released)
        # The dead turn may have committed sends it never published: the next turn sends again.
        Checkpoint.objects.using(self.db).unsend(parked)
        counted = orphans.exclude(id__in=parked)
        dead = [
            run_id
            for run_id in counted.filter(recovery_attempts__gte=max_attempts).values_list("id", flat=True)
            if counted.filter(id=run_id).update(
                status=Status.DEAD, error=error, wake_at=None, finished_at=now, **released
            )
        ]
        suspended = list(counted.exclude(id__in=dead).values_list("id", flat=True))
        counted.filter(id__in=suspended).update(
            status=Status.SUSPENDED, recovery_attempts=F("recovery_attempts") + 1, wake_at=now, **released
        )
        return {"parked": parked, Status.DEAD: dead, Status.SUSPENDED: suspended}

    def held_by(self, owner_prefix: str, limit: int) -> list[tuple[str, str]]:
        """(id, queue) of running runs whose lease names this instance."""
        qs = self.filter(status=Status.RUNNING, locked_by__startswith=owner_prefix)
        return list(qs.values_list("id", "queue")[:limit])

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
            return Status.DEAD
        if held.update(status=Status.SUSPENDED, recovery_attempts=F("recovery_attempts") + 1, wake_at=now, **released):
            return Status.SUSPENDED
        return None


def _skip_locked(qs: models.QuerySet[Any]) -> models.QuerySet[Any]:
    # SKIP LOCKED only spreads concurrent sweeps on PostgreSQL; guarded UPDATEs keep correctness.
    if qs.db and _supports_skip_locked(qs.db):
        return qs.select_for_update(skip_locked=True)
    return qs


def _supports_skip_locked(alias: str) -> bool:
    return bool(connections[alias].features.has_select_for_update_skip_locked)


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=255)
    workflow = models.CharField(max_length=200, db_index=True)
    version = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    queue = models.CharField(max_length=200)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    continued_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="continued_by"
    )
    namespace = models.CharField(max_length=100, blank=True, default="")
    tags = models.JSONField(default=list, blank=True)
    search_attributes = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    recovery_attempts = models.PositiveIntegerField(default=0)
    locked_by = models.CharField(max_length=255, null=True, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    #: Bumped by every wake; a turn that read an older value runs again instead of sleeping.
    wakes = models.BigIntegerField(default=0)
    #: Positions whose failure ended the run: what retry() gives a fresh attempt.
    failed_seqs = models.JSONField(null=True, blank=True)
    #: The position in the parent's history that waits for this run.
    parent_seq = models.PositiveIntegerField(null=True, blank=True)
    #: Execution deadline of the whole run (the workflow's ``timeout``).
    deadline = models.DateTimeField(null=True, blank=True)
    #: A durable ``cancel(compensate=True)``: the next turn unwinds the saga, then cancels.
    cancel_request = models.JSONField(null=True, blank=True)
    #: ``<workflow>:<key>`` of a singleton workflow's run; its place in the key's line; and
    #: whether it holds one of the key's slots (a run that does not waits, pending, unclaimable).
    singleton_key = models.CharField(max_length=255, null=True, blank=True)
    singleton_seq = models.BigIntegerField(null=True, blank=True)
    admitted = models.BooleanField(default=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["status", "wake_at"], name="durable_run_due"),
            models.Index(fields=["status", "locked_until"], name="durable_run_lease"),
            models.Index(fields=["created_at"], name="durable_run_created"),
            # The retention sweep: finished runs of some statuses, oldest first.
            models.Index(fields=["status", "finished_at"], name="durable_run_finished"),
            models.Index(fields=["singleton_key", "status"], name="durable_run_singleton"),
            # Runs waiting for a singleton slot, found by the timer sweep's repair pass.
            models.Index(fields=["singleton_seq"], name="durable_run_waiting", condition=models.Q(admitted=False)),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} {self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL

    def ended_as(self, status: str, **fields: Any) -> Run:
        """Bring this instance in line with the guarded UPDATE that just ended its run (its
        ``status`` and the ``fields`` it wrote), for what follows an end; return it."""
        self.status = status
        for name, value in fields.items():
            setattr(self, name, value)
        return self


#: A settled or failed attempt is held by no one.
_UNHELD: dict[str, Any] = {"held_by": None, "held_until": None}


class CheckpointQuerySet(models.QuerySet["Checkpoint"]):
    def _attempt(self, run_id: str, seq: int, attempt: int) -> models.QuerySet[Checkpoint]:
        return self.filter(run_id=run_id, seq=seq, status="pending", attempt=attempt)

    def begin(self, run_id: str, seq: int, attempt: int, token: str | None, now: datetime) -> bool:
        """A worker picked up this attempt of a Celery task used as a step; False if the token is
        not the attempt's, or the attempt is stale or already settled."""
        return bool(self._attempt(run_id, seq, attempt).filter(token=token).update(started_at=now))

    def take(
        self, run_id: str, seq: int, attempt: int, token: str | None, holder: str, now: datetime, until: datetime
    ) -> Checkpoint | None:
        """Start this attempt, held by ``holder`` until ``until``, and return its row, in one
        statement. None when the message is not the one durable sent for it (token), the attempt
        is stale, settled or already started (a redelivery never runs an attempt twice as
        itself), or its run has finished."""
        ops = connections[self.db].ops
        at = ops.adapt_datetimefield_value
        # Rows written before attempts had tokens match only a message without one.
        token_matches = "token IS NULL" if token is None else "token = %s"
        sql = (
            f"UPDATE {ops.quote_name(Checkpoint._meta.db_table)} SET started_at = %s, held_by = %s, "
            "held_until = %s "
            "WHERE run_id = %s AND seq = %s AND status = 'pending' AND attempt = %s "
            f"AND enqueued_at IS NOT NULL AND started_at IS NULL AND {token_matches} AND EXISTS ("
            f"SELECT 1 FROM {ops.quote_name(Run._meta.db_table)} WHERE id = %s AND status IN (%s, %s, %s)"
            ") RETURNING *"
        )
        params = [
            at(now), holder, at(until), run_id, seq, attempt, *([] if token is None else [token]),
            run_id, *UNFINISHED,
        ]
        taken = list(Checkpoint.objects.using(self.db).raw(sql, params))
        return taken[0] if taken else None

    def renew_hold(self, run_id: str, seq: int, attempt: int, holder: str, until: datetime) -> bool:
        """Extend the hold of a running attempt; False when it ended or was declared lost."""
        return bool(self._attempt(run_id, seq, attempt).filter(held_by=holder).update(held_until=until))

    def lapsed(self, now: datetime, limit: int) -> list[str]:
        """Runs with a started attempt whose holder stopped renewing it: its process died, or
        its result could not be recorded. Each such hold is let go (so it is reported once) and
        the turn that wakes counts the attempt as lost."""
        rows = self.filter(held_by__isnull=False, held_until__lt=now, status="pending")
        found = list(_skip_locked(rows.order_by("held_until")).values_list("id", "run_id")[:limit])
        self.filter(id__in=[pk for pk, _ in found], held_until__lt=now).update(held_by=None)
        return sorted({run_id for _, run_id in found})

    def let_go(self, holder_prefix: str, stale_before: datetime, now: datetime, limit: int) -> list[str]:
        """Runs whose attempts a dead predecessor of this instance held (holds not renewed since
        ``stale_before``): the holds lapse now, and the turn that wakes counts them as lost."""
        rows = self.filter(held_by__startswith=holder_prefix, held_until__lt=stale_before, status="pending")
        found = list(rows.values_list("id", "run_id")[:limit])
        self.filter(id__in=[pk for pk, _ in found], held_until__lt=stale_before).update(held_until=now)
        return sorted({run_id for _, run_id in found})

    def unsend(self, run_ids: list[str]) -> int:
        """Forget that the unstarted attempts of these runs were sent, so their next turn sends
        them again with new tokens (the old messages, if any, are then refused). For runs whose
        last sender may have died between its commit and its publish."""
        return self.filter(
            run_id__in=run_ids, kind="step", status="pending", enqueued_at__isnull=False, started_at__isnull=True
        ).update(enqueued_at=None, wake_at=None, token=None)

    def complete(self, run_id: str, seq: int, attempt: int, output: Any, now: datetime) -> bool:
        return bool(
            self._attempt(run_id, seq, attempt).update(
                status="completed", output=output, error=None, wake_at=None, finished_at=now, **_UNHELD
            )
        )

    def fail(self, run_id: str, seq: int, attempt: int, error: dict[str, Any], now: datetime) -> bool:
        return bool(
            self._attempt(run_id, seq, attempt).update(
                status="failed", error=error, wake_at=None, finished_at=now, **_UNHELD
            )
        )

    def retry_at(
        self, run_id: str, seq: int, attempt: int, error: dict[str, Any], wake_at: datetime
    ) -> bool:
        """Close a failed attempt and schedule the next one after its backoff."""
        return bool(
            self._attempt(run_id, seq, attempt).update(
                attempt=attempt + 1,
                error=error,
                wake_at=wake_at,
                enqueued_at=None,
                started_at=None,
                last_heartbeat_at=None,
                token=None,
                **_UNHELD,
            )
        )

    def rewrite(
        self, run_id: str, seq: int, expected: tuple[str, int], *, owner: str | None = None, **fields: Any
    ) -> bool:
        """Write a turn's new view of a position, if it is still in the state the turn read
        (and, given ``owner``, only while that turn still holds the run's lease)."""
        status, attempt = expected
        if owner is None:
            return bool(self.filter(run_id=run_id, seq=seq, status=status, attempt=attempt).update(**fields))
        # Mid-turn (a step run in place ends, say): one plain statement, the ORM's compiling of
        # an UPDATE with an EXISTS costs more than the statement itself on this path.
        connection = connections[self.db]
        ops = connection.ops
        columns = [Checkpoint._meta.get_field(name) for name in fields]
        assignments = ", ".join(f"{ops.quote_name(f.column)} = %s" for f in columns)
        values = [f.get_db_prep_save(fields[f.name], connection) for f in columns]
        sql = (
            f"UPDATE {ops.quote_name(Checkpoint._meta.db_table)} SET {assignments} "
            "WHERE run_id = %s AND seq = %s AND status = %s AND attempt = %s AND EXISTS ("
            f"SELECT 1 FROM {ops.quote_name(Run._meta.db_table)} WHERE id = %s AND locked_by = %s)"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*values, run_id, seq, status, attempt, run_id, owner])
            return cursor.rowcount == 1

    def insert_fenced(self, row: Checkpoint, owner: str) -> bool:
        """Insert ``row`` in one statement, only while ``owner`` holds its run's lease."""
        connection = connections[self.db]
        ops = connection.ops
        fields = [f for f in Checkpoint._meta.concrete_fields if not f.primary_key]
        columns = ", ".join(ops.quote_name(f.column) for f in fields)
        values = [f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields]
        run_table = ops.quote_name(Run._meta.db_table)
        sql = (
            f"INSERT INTO {ops.quote_name(Checkpoint._meta.db_table)} ({columns}) "
            f"SELECT {', '.join(['%s'] * len(fields))} "
            f"WHERE EXISTS (SELECT 1 FROM {run_table} WHERE id = %s AND locked_by = %s)"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*values, row.run_id, owner])
            return cursor.rowcount == 1

    def fan_closed(self, run_id: str, fan: int) -> bool:
        """No member of the fan is still pending (asked after a member's result committed)."""
        return not self.filter(run_id=run_id, status="pending", fan=fan).exists()

    def settle_child(self, run_id: str, seq: int, status: str, output: Any, error: Any, now: datetime) -> bool:
        """Record at position ``seq`` of ``run_id`` how the child started there ended."""
        return bool(
            self.filter(run_id=run_id, seq=seq, kind="child", status="pending").update(
                status=status, output=output, error=error, finished_at=now
            )
        )

    def reattempt(self, run_id: str, seqs: list[int]) -> None:
        """Give the failed positions ``seqs`` of a failed, dead or cancelled run a fresh attempt
        (call before the run is reopened): a child position waits again for its run, retried
        with it; any other position is forgotten, so the next turn replays it as new."""
        ended = Exists(Run.objects.filter(id=run_id, status__in=RETRYABLE))
        positions = self.filter(ended, run_id=run_id, seq__in=seqs)
        positions.filter(kind="child", status="failed").update(status="pending", error=None, finished_at=None)
        positions.exclude(kind="child").delete()

    def beat(self, run_id: str, seq: int, attempt: int, now: datetime, progress: Any, with_progress: bool) -> bool:
        fields: dict[str, Any] = {"last_heartbeat_at": now}
        if with_progress:
            fields["progress"] = progress
        return bool(self._attempt(run_id, seq, attempt).update(**fields))


class Checkpoint(models.Model):
    """One position of a run's history: a step, timer, signal wait or recorded value."""

    # No index of its own: the (run, seq) constraint's index serves lookups by run, and a plain
    # run index tempts PostgreSQL into scanning a whole fan's rows to find one position.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16)
    name = models.CharField(max_length=255)
    status = models.CharField(max_length=16, default="pending")
    attempt = models.PositiveIntegerField(default=1)
    queue = models.CharField(max_length=200, blank=True, default="")
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    progress = models.JSONField(null=True, blank=True)
    #: First position of the fan (ctx.all / all_settled) this member belongs to.
    fan = models.PositiveIntegerField(null=True, blank=True)
    #: The fan resumes the run at its first failure (ctx.all), not only once closed.
    fail_fast = models.BooleanField(default=False)
    #: The secret of the attempt sent last: only a message carrying it may start or settle it.
    token = models.CharField(max_length=64, null=True, blank=True)
    #: The process running a dispatched attempt, and until when its hold lasts unless renewed.
    held_by = models.CharField(max_length=255, null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="durable_checkpoint_position"),
        ]
        indexes = [
            # "Is any member of this fan still pending", in one probe; fan before status, so a lookup
            # of one position never prefers it to the (run, seq) index.
            models.Index(fields=["run", "fan", "status"], name="durable_checkpoint_fan"),
            # The runs waiting for an event of this name, found by publish_event().
            models.Index(
                fields=["name", "status"], name="durable_checkpoint_event_wait", condition=models.Q(kind="event")
            ),
            # Held attempts whose holder stopped renewing, found by the orphan sweep.
            models.Index(
                fields=["held_until"], name="durable_checkpoint_held", condition=models.Q(held_by__isnull=False)
            ),
        ]
        ordering = ["run", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind} {self.name} ({self.status})"


class SignalQuerySet(models.QuerySet["Signal"]):
    def consume(self, signal_id: int, seq: int) -> bool:
        return bool(self.filter(id=signal_id, consumed_seq__isnull=True).update(consumed_seq=seq))


class Signal(models.Model):
    """A signal sent to a run, kept until a wait at position ``consumed_seq`` takes it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=255)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    consumed_seq = models.PositiveIntegerField(null=True, blank=True)

    objects = SignalQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["run", "consumed_seq"], name="durable_signal_unconsumed"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"signal {self.name} for {self.run_id}"


class EventQuerySet(models.QuerySet["Event"]):
    def oldest_match(
        self, name: str, match: dict[str, Any] | None, since: datetime, exclude: set[int]
    ) -> tuple[int, Any] | None:
        """(id, payload) of the oldest event ``name`` since ``since`` whose payload holds every
        key/value of ``match``, leaving out the ids in ``exclude``; None if there is none."""
        from django.db.models.fields.json import KeyTransform

        events = self.filter(name=name, created_at__gte=since).exclude(id__in=exclude)
        for i, (key, value) in enumerate((match or {}).items()):
            # An alias per key: a key named like a lookup ("in", "contains") stays a key.
            events = events.alias(**{f"key_{i}": KeyTransform(key, "payload")}).filter(**{f"key_{i}": value})
        return events.order_by("id").values_list("id", "payload").first()


class Event(models.Model):
    """A published event, kept for ``EVENT_BUFFER_TTL`` for the waits that come later."""

    #: Arrival order: a wait receives the oldest matching event it has not received yet.
    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    objects = EventQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["name", "created_at"], name="durable_event_name"),
            models.Index(fields=["created_at"], name="durable_event_created"),
        ]

    def __str__(self) -> str:
        return f"event {self.name} #{self.id}"


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    def due(self, now: datetime, limit: int) -> list[Schedule]:
        """Unpaused schedules whose next tick has come, oldest first."""
        qs = self.filter(paused=False, next_at__lte=now).order_by("next_at")
        return list(_skip_locked(qs)[:limit])

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


class Schedule(models.Model):
    """A persisted cron schedule: each tick starts one run, id ``schedule:<key>:<tick>``."""

    key = models.CharField(primary_key=True, max_length=200)
    workflow = models.CharField(max_length=200)
    input = models.JSONField(null=True, blank=True)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    #: "skip": a tick that finds the previous run unfinished starts nothing; "allow": it starts anyway.
    overlap = models.CharField(max_length=16, default="skip")
    paused = models.BooleanField(default=False)
    next_at = models.DateTimeField()
    last_run_id = models.CharField(max_length=255, null=True, blank=True)
    #: Declared by ``@durable.workflow(schedule=...)``: kept in step with the code at each sweep.
    declared = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["paused", "next_at"], name="durable_schedule_due")]

    def __str__(self) -> str:
        return f"schedule {self.key} ({self.cron} {self.timezone})"


class SingletonSlot(models.Model):
    """One row per singleton key: locked while the key's slots are counted, so two starts
    cannot both take the last one; ``next_seq`` numbers the key's runs in start order."""

    key = models.CharField(primary_key=True, max_length=255)
    next_seq = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"singleton {self.key}"


@functools.cache
def column_length(model: str, field: str) -> int:
    """The ``max_length`` of a durable model's column: what a string stored there may hold."""
    from django.apps import apps

    length: int = apps.get_model("durable", model)._meta.get_field(field).max_length
    return length
