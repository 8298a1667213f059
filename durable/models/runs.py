"""A run: its row, its turn lease and every transition of its status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When, signals
from django.db.models.expressions import RawSQL

from ..statuses import TERMINAL, UNFINISHED
from .base import (
    RETRYABLE,
    Status,
    all_columns,
    batch_of,
    column_names,
    converted,
    insert,
    insertion,
    referring,
    returned,
    skip_locked,
    unflushed,
    update_where,
    updating,
)
from .blocked import BlockedRuns
from .debounced import DebouncedRuns
from .orphans import OrphanedRuns
from .payloads import PayloadField
from .trees import RunTrees

#: What ends the lease owner of a run's first claim (see ``RunQuerySet.claim``).
FIRST_CLAIM = "+first"
#: The PostgreSQL channel every run end is announced on, the run's id as the payload, by a
#: trigger in the transaction that ends it (migration 0014).
RUN_ENDED = "durable_run_ended"


def settling(
    run_id: str, owner: str, wakes: int, now: datetime, fields: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a turn's settle writes (its ``fields`` and the lease let go) and the row it writes
    them to: the run still held by ``owner``, running, with no wake since ``wakes``."""
    # In the caller's order, then the lease's: the crash-point explorations name a statement by
    # its first columns.
    fields = {**fields}
    fields.setdefault("recovery_attempts", 0)
    fields.update(locked_by=None, locked_until=None, updated_at=now)
    return fields, {"id": run_id, "locked_by": owner, "wakes": wakes, "status": Status.RUNNING}


@dataclass(frozen=True)
class Claim:
    """Who takes a run's turn lease, for how long, and only on which queues (None: any)."""

    owner: str
    lease: timedelta
    queues: frozenset[str] | None


class RunQuerySet(BlockedRuns, DebouncedRuns, OrphanedRuns, RunTrees, models.QuerySet["Run"]):
    def serving(self, namespace: str | None) -> RunQuerySet:
        """The runs of ``namespace``; every run when None (a process that serves them all)."""
        return self if not namespace else self.filter(namespace=namespace)

    def claim(
        self, run_id: str, owner: str, now: datetime, lease: timedelta, namespace: str | None = None
    ) -> Run | None:
        """Take the turn lease of an unfinished run whose lease is free or expired; return the row.

        Taking over a ``running`` run means its last turn died holding the lease: that counts
        as a recovery attempt. One statement: the UPDATE returns the claimed row. The lease is
        held by the row's ``locked_by``: ``owner``, or ``owner`` + FIRST_CLAIM when the run had
        never started (so its turn knows it has no history to read). With ``namespace``, only a
        run of that namespace: a worker of one namespace never takes another's run.
        """
        ops = connections[self.db].ops
        at = ops.adapt_datetimefield_value
        table = ops.quote_name(Run._meta.db_table)
        sql = (
            f"UPDATE {table} SET "
            "recovery_attempts = CASE WHEN status = %s THEN recovery_attempts + 1 ELSE recovery_attempts END, "
            "status = %s, locked_by = CASE WHEN started_at IS NULL THEN %s ELSE %s END, locked_until = %s, "
            "started_at = COALESCE(started_at, %s), "
            f"updated_at = %s {unflushed(self.db)}"
            "WHERE id = %s AND status IN (%s, %s, %s) AND (locked_until IS NULL OR locked_until < %s) "
            f"AND admitted = %s {'AND namespace = %s ' if namespace else ''}"
            f"RETURNING {all_columns(Run, self.db)}"
        )
        params = [
            Status.RUNNING,
            Status.RUNNING,
            owner + FIRST_CLAIM,
            owner,
            at(now + lease),
            at(now),
            at(now),
            run_id,
            *UNFINISHED,
            at(now),
            True,
            *([namespace] if namespace else []),
        ]
        claimed = returned(Run, self.db, sql, params, column_names(Run))
        return claimed[0] if claimed else None

    def ending(self, run_id: str) -> Run | None:
        """The run's status, output and error, and the workflow and version that shape its output
        (the rest deferred), by one plain statement: what a caller waiting for the run reads each
        time it looks."""
        sql = f"SELECT id, status, output, error, workflow, version FROM {connections[self.db].ops.quote_name(Run._meta.db_table)} WHERE id = %s"
        found = returned(Run, self.db, sql, [run_id])
        return found[0] if found else None

    def renew(self, run_id: str, owner: str, now: datetime, lease: timedelta) -> bool:
        """Extend a lease this owner still holds; False means it was taken over."""
        return bool(
            self.filter(id=run_id, locked_by=owner, status=Status.RUNNING).update(locked_until=now + lease)
        )

    def settle(
        self,
        run_id: str,
        owner: str,
        wakes: int,
        now: datetime,
        inserting: models.Model | None = None,
        rewriting: tuple[str, list[Any]] | None = None,
        **fields: Any,
    ) -> bool:
        """End a turn: write its outcome and release the lease; with ``inserting``, insert that
        row too, only if the settle is not refused: in the same statement on PostgreSQL (a
        data-modifying WITH), in one transaction elsewhere.

        ``rewriting``: an UPDATE (statement, parameters) of one row written first, the settle
        only if it changed that row; it stands even when the settle is refused (a result run in
        place, written under the lease). One statement on PostgreSQL, one transaction elsewhere.

        Refused (False) when the lease was lost or a wake arrived since the turn read the run.
        """
        fields, where = settling(run_id, owner, wakes, now, fields)
        if rewriting is not None:
            return self._settle_rewriting(rewriting, fields, where)
        if inserting is None:
            return update_where(Run, self.db, fields, where) == 1
        if connections[self.db].vendor != "postgresql":
            with transaction.atomic(using=self.db):
                if update_where(Run, self.db, fields, where) != 1:
                    return False
                insert(type(inserting), self.db, [inserting])
                return True
        settle, params = updating(Run, self.db, fields, where)
        adding, adding_params = insertion(type(inserting), self.db, [inserting], source="FROM settled")
        with connections[self.db].cursor() as cursor:
            cursor.execute(f"WITH settled AS ({settle} RETURNING 1) {adding}", [*params, *adding_params])
            return int(cursor.rowcount) == 1

    def _settle_rewriting(
        self, rewriting: tuple[str, list[Any]], fields: dict[str, Any], where: dict[str, Any]
    ) -> bool:
        rewrite, rewrite_params = rewriting
        if connections[self.db].vendor != "postgresql":
            with transaction.atomic(using=self.db):
                with connections[self.db].cursor() as cursor:
                    cursor.execute(rewrite, rewrite_params)
                    if cursor.rowcount != 1:
                        return False
                return update_where(Run, self.db, fields, where) == 1
        settle, params = updating(Run, self.db, fields, where, " AND EXISTS (SELECT 1 FROM rewritten)")
        with connections[self.db].cursor() as cursor:
            cursor.execute(f"WITH rewritten AS ({rewrite} RETURNING 1) {settle}", [*rewrite_params, *params])
            return int(cursor.rowcount) == 1

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
        woken = self._wake(run_id, now, redrive_at, None)
        return woken.queue if woken is not None else None

    def wake_and_claim(
        self, run_id: str, now: datetime, redrive_at: datetime, claim: Claim
    ) -> tuple[str | None, Run | None]:
        """``wake``, and in the same statement take the turn lease for ``claim.owner`` when
        ``claim`` would get it (free or expired, the run admitted, its queue one of
        ``claim.queues``): (the run's queue or None if finished, the claimed row or None).

        A worker that records a step's result and runs the next turn itself so commits once
        where waking and claiming would commit twice."""
        return self.woken_as(self._wake(run_id, now, redrive_at, claim), claim)

    def _wake(self, run_id: str, now: datetime, redrive_at: datetime, claim: Claim | None) -> Run | None:
        woken = returned(
            Run, self.db, *self.waking(run_id, now, redrive_at, claim), column_names(Run) if claim else None
        )
        return woken[0] if woken else None

    def waking(
        self, run_id: str, now: datetime, redrive_at: datetime, claim: Claim | None, only_if: str = ""
    ) -> tuple[str, list[Any]]:
        """The statement of ``wake`` (``wake_and_claim`` given ``claim``) and its parameters:
        it returns the run's id and queue, or the whole row with a claim. ``only_if``: one more
        condition, raw SQL without parameters."""
        connection = connections[self.db]
        ops = connection.ops
        at = ops.adapt_datetimefield_value
        earliest = "MIN" if connection.vendor == "sqlite" else "LEAST"
        claiming, params = "", []
        if claim is not None:
            # As ``claim``: taking over a ``running`` run means its last turn died holding it.
            free = "admitted = %s AND (locked_until IS NULL OR locked_until < %s)"
            free_params: list[Any] = [True, at(now)]
            if claim.queues is not None:
                free += f" AND queue IN ({', '.join(['%s'] * len(claim.queues))})"
                free_params += sorted(claim.queues)
            claiming = (
                f"recovery_attempts = CASE WHEN {free} AND status = %s "
                "THEN recovery_attempts + 1 ELSE recovery_attempts END, "
                f"status = CASE WHEN {free} THEN %s ELSE status END, "
                f"locked_by = CASE WHEN {free} THEN %s ELSE locked_by END, "
                f"locked_until = CASE WHEN {free} THEN %s ELSE locked_until END, "
                f"started_at = CASE WHEN {free} THEN COALESCE(started_at, %s) ELSE started_at END, "
            )
            params = [
                *free_params,
                Status.RUNNING,
                *free_params,
                Status.RUNNING,
                *free_params,
                claim.owner,
                *free_params,
                at(now + claim.lease),
                *free_params,
                at(now),
            ]
        sql = (
            f"UPDATE {ops.quote_name(Run._meta.db_table)} SET wakes = wakes + 1, "
            f"wake_at = CASE WHEN admitted THEN {earliest}(COALESCE(wake_at, %s), %s) ELSE wake_at END, "
            f"{claiming}updated_at = %s "
            f"WHERE id = %s AND status IN (%s, %s, %s){' AND ' + only_if if only_if else ''} RETURNING "
            # The turn that claimed it needs the whole row; a wake alone, its queue.
            + (all_columns(Run, self.db) if claim is not None else "id, queue")
        )
        redrive = at(redrive_at)
        return sql, [redrive, redrive, *params, at(now), run_id, *UNFINISHED]

    def woken_as(self, woken: Run | None, claim: Claim | None) -> tuple[str | None, Run | None]:
        """What ``wake_and_claim`` says of the row its statement returned."""
        if woken is None:
            return None, None
        return woken.queue, woken if claim is not None and woken.locked_by == claim.owner else None

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

    def interrupted(self, run_id: str, seq: int) -> bool:
        """Whether the step at ``seq`` should stop: its run was cancelled with ``interrupt=True``
        and the cancel was not delivered to the body before that step began (a cleanup step the
        body runs after catching ``Cancelled`` is not stopped). Asked by a heartbeating step."""
        Checkpoint = referring(self, "checkpoints")

        delivered_before = Checkpoint.objects.filter(run_id=OuterRef("id"), kind="cancel", seq__lt=seq)
        interrupted: bool = (
            self.filter(id=run_id, cancel_request__interrupt=True).exclude(Exists(delivered_before)).exists()
        )
        return interrupted

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

    def add(self, **values: Any) -> Run:
        """Insert a new run of ``values`` (the id among them) and return it: ``create()`` without
        compiling an INSERT each time (on the start path that cost a fifth of a start), unless
        a receiver of Django's ``pre_save``/``post_save`` listens for runs, which then hears it."""
        if signals.pre_save.has_listeners(Run) or signals.post_save.has_listeners(Run):
            created: Run = self.create(**values)
            return created
        run = Run(**values)
        sql, params = insertion(Run, self.db, [run], keyed=True)
        with connections[self.db].cursor() as cursor:
            cursor.execute(sql, params)
        run._state.adding, run._state.db = False, self.db
        return run

    def start_child(
        self, child: Any, *, parent: Run, now: datetime, queue: str, reconcile: timedelta, **fields: Any
    ) -> bool:
        """Create the child run a parent's turn starts; False if that id already exists."""
        fields.setdefault("wake_at", now + reconcile)
        try:
            with transaction.atomic(using=self.db):
                self.add(
                    id=child.run_id,
                    workflow=child.workflow,
                    version=child.version,
                    queue=queue,
                    input=child.input,
                    parent=parent,
                    parent_seq=child.seq,
                    namespace=parent.namespace,
                    created_at=now,
                    updated_at=now,
                    **fields,
                )
        except IntegrityError:
            return False
        return True

    def take_due(
        self,
        now: datetime,
        until: datetime,
        limit: int,
        *,
        status: str | None = None,
        after: tuple[datetime, str] | None = None,
    ) -> list[tuple[str, str, datetime]]:
        """Move the timers of up to ``limit`` due waiting runs (in ``status``, else pending or
        suspended) to ``until`` (the next safety-net wake; the turn sets the real one), the most
        overdue first, and return their (id, queue, when it was due). One statement per batch:
        the rows it takes leave the due range, and a concurrent sweep skips the rows this one
        holds, then finds them no longer due.

        ``after``: the (due time, id) of the last run the batch before took. The batch then starts
        its index range past it, rather than stepping again over the entries of every row taken
        before (their old versions stay in the index until vacuumed), even among runs due at the
        same instant: a backlog is drained in O(rows).
        """
        statuses = (status,) if status is not None else (Status.PENDING, Status.SUSPENDED)
        qs = self.filter(status__in=statuses, wake_at__lte=now, admitted=True)
        if after is not None:
            at = Run._meta.get_field("wake_at").get_db_prep_value(after[0], connections[self.db])
            past = RawSQL("(wake_at, id) > (%s, %s)", (at, after[1]), output_field=models.BooleanField())
            qs = qs.filter(past)
        qs = qs.order_by("wake_at", "id")
        ops = connections[self.db].ops
        if connections[self.db].vendor == "sqlite":
            # A single writer, and a RETURNING that sees only the updated table: two statements.
            found = list(qs.values_list("id", "queue", "wake_at")[:limit])
            self.filter(id__in=[run_id for run_id, *_ in found]).update(wake_at=until)
            return found
        at = ops.adapt_datetimefield_value
        table = ops.quote_name(Run._meta.db_table)
        batch, params = batch_of(skip_locked(qs).values("id", "wake_at")[:limit])
        sql = (
            f"{batch} UPDATE {table} SET wake_at = %s FROM batch WHERE {table}.id = batch.id "
            f"RETURNING {table}.id, {table}.queue, batch.wake_at"
        )
        with connections[self.db].cursor() as cursor:
            cursor.execute(sql, [*params, at(until)])
            return converted(Run, self.db, ("id", "queue", "wake_at"), cursor.fetchall())

    def wake_by(self, run_id: str, at: datetime) -> str | None:
        """Bring an unfinished run's timer forward to ``at`` at the latest (a step's rate token
        falls due then); return its queue, or None if it has finished. Its wake counter moves
        too: a turn running now replays rather than settling on the step as it read it."""
        sooner = Q(wake_at__isnull=True) | Q(wake_at__gt=at)
        due = Case(When(sooner, then=Value(at, output_field=models.DateTimeField())), default=F("wake_at"))
        if not self.filter(id=run_id, status__in=UNFINISHED).update(wakes=F("wakes") + 1, wake_at=due):
            return None
        queue: str | None = self.filter(id=run_id).values_list("queue", flat=True).first()
        return queue


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=255)
    workflow = models.CharField(max_length=200, db_index=True)
    version = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    queue = models.CharField(max_length=200)
    input = PayloadField(null=True, blank=True, offload=True)
    output = PayloadField(null=True, blank=True, offload=True)
    error = models.JSONField(null=True, blank=True)
    # Their indexes are partial (Meta): most runs have neither.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children", db_index=False
    )
    continued_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="continued_by", db_index=False
    )
    #: The run this one is a fork of (``durable.fork``), and the position it was forked at: its
    #: history before that position is a copy. A plain id, not a foreign key: the origin may be
    #: deleted by retention while its fork lives on.
    forked_from_id = models.CharField(max_length=255, null=True, blank=True)
    forked_at = models.PositiveIntegerField(null=True, blank=True)
    namespace = models.CharField(max_length=100, blank=True, default="")
    tags = models.JSONField(default=list, blank=True)
    search_attributes = models.JSONField(default=dict, blank=True)
    #: The values the body exposed with ``ctx.expose``, by name (the latest write of each), for
    #: ``durable.query``; written in the transaction of the turn that records them.
    exposed = PayloadField(default=dict, blank=True)
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
    #: Execution deadline of the whole run (the workflow's ``timeout``; a child's is never past
    #: its parent's).
    deadline = models.DateTimeField(null=True, blank=True)
    #: What this child run becomes when its parent ends unfinished: ``"interrupt"`` or
    #: ``"abandon"``; None is the default, ``"cancel"`` (``ctx.child(on_parent_close=...)``).
    on_parent_close = models.CharField(max_length=16, null=True, blank=True)
    #: A durable ``cancel(compensate=True)``: the next turn unwinds the saga, then cancels.
    cancel_request = models.JSONField(null=True, blank=True)
    #: ``<workflow>:<key>`` of a singleton workflow's run; its place in the key's line; and
    #: whether it holds one of the key's slots (a run that does not waits, pending, unclaimable).
    singleton_key = models.CharField(max_length=255, null=True, blank=True)
    singleton_seq = models.BigIntegerField(null=True, blank=True)
    admitted = models.BooleanField(default=True)
    #: Its place among the runs waiting in its line (a lane's, a singleton's): higher first.
    priority = models.IntegerField(default=0, db_default=0)
    #: The key of the ``durable.debounce`` calls this run gathered (see ``models.debounced``).
    debounce_key = models.CharField(max_length=200, null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        # What the admin lets an operator do to a run, one permission each (deleting a run and
        # its subtree takes Django's own ``delete_run``).
        permissions = [
            ("retry_run", "Can retry a failed, dead or cancelled run"),
            ("cancel_run", "Can cancel a run, with or without compensation"),
            ("signal_run", "Can send a signal or an update to a run"),
            ("resume_run", "Can wake a waiting run now"),
            ("fork_run", "Can fork a run from one of its positions"),
            # Payloads may hold personal data: the admin shows them decoded only with this.
            ("view_payloads", "Can see the payloads of runs, steps, messages and entities"),
        ]
        # Every change of a run's status or timer writes a new entry in each index whose
        # condition the row meets (PostgreSQL cannot update such a row in place): the indexes
        # only some runs need are partial, so a turn or a timer pass writes four or five, not nine.
        indexes = [
            # With the id, a timer pass continues where its batch before ended among equal times.
            models.Index(fields=["status", "wake_at", "id"], name="durable_run_due"),
            models.Index(
                fields=["status", "locked_until"],
                name="durable_run_lease",
                condition=models.Q(status=Status.RUNNING),
            ),
            models.Index(fields=["created_at"], name="durable_run_created"),
            # The retention sweep: finished runs of some statuses, oldest first.
            models.Index(
                fields=["status", "finished_at"],
                name="durable_run_finished",
                condition=models.Q(finished_at__isnull=False),
            ),
            # The retention sweep's candidates, oldest first: finished roots only, in the order read.
            models.Index(
                fields=["finished_at", "id"],
                name="durable_run_root_finished",
                condition=models.Q(parent__isnull=True, finished_at__isnull=False),
            ),
            models.Index(
                fields=["singleton_key", "status"],
                name="durable_run_singleton",
                condition=models.Q(singleton_key__isnull=False),
            ),
            models.Index(
                fields=["parent"], name="durable_run_parent", condition=models.Q(parent__isnull=False)
            ),
            models.Index(
                fields=["continued_from"],
                name="durable_run_continued",
                condition=models.Q(continued_from__isnull=False),
            ),
            models.Index(
                fields=["forked_from_id"],
                name="durable_run_forked",
                condition=models.Q(forked_from_id__isnull=False),
            ),
            # Runs waiting for a singleton slot, found by the timer sweep's repair pass.
            models.Index(
                fields=["singleton_seq"], name="durable_run_waiting", condition=models.Q(admitted=False)
            ),
            # Debounced runs gathering calls, admitted by the timer pass once due.
            models.Index(
                fields=["wake_at"],
                name="durable_run_debouncing",
                condition=models.Q(debounce_key__isnull=False, admitted=False),
            ),
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
