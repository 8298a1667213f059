"""The gates of fleet-wide step limits, and the starts a rate limit counts.

A step attempt's place under a limit lives on its Checkpoint (``flow``, ``flow_key``,
``flow_seq``); the gate row is locked while a key's slots are counted, as a SingletonSlot is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections, models
from django.db.models import F, Q

from ..statuses import UNFINISHED, CheckpointStatus
from .checkpoints import HELD, RATE, WAITING, Checkpoint
from .runs import Run

#: An attempt that stops waiting to start is held by no process yet.
_UNHELD: dict[str, Any] = {"held_by": None, "held_until": None}


class FlowGateQuerySet(models.QuerySet["FlowGate"]):
    def lock(self, key: str, *, create: bool = True) -> FlowGate | None:
        """The gate of ``key``, locked until the transaction ends; created on first use (else
        None when there is none). One plain statement once it exists: it is on every start and
        end of a limited step, where the ORM's compiling would cost more than the statement."""
        connection = connections[self.db]
        ops = connection.ops
        # SQLite has no FOR UPDATE: its IMMEDIATE transactions take the database's write lock.
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        sql = f"SELECT next_seq, waiting FROM {ops.quote_name(FlowGate._meta.db_table)} WHERE key = %s{lock}"
        with connection.cursor() as cursor:
            cursor.execute(sql, [key])
            found = cursor.fetchone()
        if found is not None:
            return FlowGate(key=key, next_seq=found[0], waiting=found[1])
        if not create:
            return None
        self.get_or_create(key=key)
        return self.lock(key, create=False)

    def join_line(self, gate: FlowGate) -> int:
        """Count one more waiter and return its place in the line (the gate locked by the caller)."""
        self.filter(key=gate.key).update(next_seq=F("next_seq") + 1, waiting=F("waiting") + 1)
        gate.next_seq += 1
        gate.waiting += 1
        place: int = gate.next_seq
        return place

    def note_waiting(self, gate: FlowGate, count: int) -> None:
        """Set the gate's count of waiters to what its line holds now (the gate locked)."""
        if gate.waiting != count:
            self.filter(key=gate.key).update(waiting=count)
            gate.waiting = count


class FlowGate(models.Model):
    """One row per limited key (``c:<step>:<key>`` for a concurrency limit, ``r:<step>`` for a
    rate limit): locked while its slots or tokens are counted, so two workers never both take
    the last one; ``next_seq`` numbers the attempts that wait in its line."""

    key = models.CharField(primary_key=True, max_length=255)
    next_seq = models.BigIntegerField(default=0)
    #: At least the number of attempts in its line (a waiter whose run ended is counted until
    #: the next hand-off looks): at 0, the attempt that frees a slot has no one to hand it to.
    waiting = models.BigIntegerField(default=0)

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


def hold_slot(
    db: str, run_id: str, seq: int, attempt: int, key: str, limit: int, now: datetime, *, behind: bool
) -> bool:
    """Give the started attempt a slot of ``key`` if fewer than ``limit`` are held (and, with
    ``behind``, no attempt waits in line before it); False if it must wait.

    Call with the key's gate locked, so the count is the one the next start sees: a slot freed
    after the count is handed on by its freer, who locks the gate after this commits and finds
    this attempt in line (``engine.flow.hand_off``). Two statements on this, every start of a
    limited step: the count names no run, so PostgreSQL keeps one plan of it for a prepared
    statement, where in one statement with the take, which names the run, it planned it afresh
    each time, over every partition of a partitioned history."""
    connection = connections[db]
    ops = connection.ops
    at = ops.adapt_datetimefield_value
    table, runs = ops.quote_name(Checkpoint._meta.db_table), ops.quote_name(Run._meta.db_table)
    unfinished = f"run_id IN (SELECT id FROM {runs} WHERE status IN (%s, %s, %s))"
    pending = f"flow_key = %s AND flow = %s AND status = '{CheckpointStatus.PENDING}'"
    line = f"EXISTS (SELECT 1 FROM {table} WHERE {pending} AND {unfinished})" if behind else "FALSE"
    counting = (
        f"SELECT (SELECT COUNT(*) FROM {table} WHERE {pending} AND (held_until IS NULL OR held_until >= %s) "
        f"AND NOT (run_id = %s AND seq = %s) AND {unfinished}), {line}"
    )
    params: list[Any] = [key, HELD, at(now), run_id, seq, *UNFINISHED]
    if behind:
        params += [key, WAITING, *UNFINISHED]
    with connection.cursor() as cursor:
        cursor.execute(counting, params)
        held, queued = cursor.fetchone()
        if held >= limit or queued:
            return False
        cursor.execute(
            f"UPDATE {table} SET flow = %s, flow_key = %s "
            f"WHERE run_id = %s AND seq = %s AND attempt = %s AND status = '{CheckpointStatus.PENDING}'",
            [HELD, key, run_id, seq, attempt],
        )
        return int(cursor.rowcount) == 1


def keeping_slot(db: str, rewriting: tuple[str, list[Any]], key: str, now: datetime) -> tuple[str, list[Any]]:
    """``rewriting`` (the fenced UPDATE of a result run in place) made to match only while its
    position holds a live slot of ``key`` and nobody waits in the key's line: the next attempt,
    inserted by the same statement (``Checkpoint.objects.rewrite_and_insert``), then takes that
    slot over. The number of slots held stays what it was, so no gate is locked; one that finds
    a waiter matches nothing, and the caller writes the usual way (the slot handed on to it)."""
    sql, params = rewriting
    ops = connections[db].ops
    gates = ops.quote_name(FlowGate._meta.db_table)
    sql += (
        " AND flow = %s AND flow_key = %s AND (held_until IS NULL OR held_until >= %s)"
        f" AND NOT EXISTS (SELECT 1 FROM {gates} WHERE key = %s AND waiting > 0)"
    )
    return sql, [*params, HELD, key, ops.adapt_datetimefield_value(now), key]


def wait_in_line(db: str, run_id: str, seq: int, attempt: int, key: str, place: int, **sent: Any) -> bool:
    """Undo the start of an attempt that found no free slot: it waits, sent but unstarted, at
    ``place`` in the line of ``key`` until a freed slot is handed to it. ``sent``: the fields
    that make one a turn started in place, unsent, a sent one (``enqueued_at``, ``wake_at``)."""
    return bool(
        _attempt(db, run_id, seq, attempt).update(
            started_at=None, flow=WAITING, flow_key=key, flow_seq=place, **_UNHELD, **sent
        )
    )


def wait_for_rate(
    db: str, run_id: str, seq: int, attempt: int, key: str, until: datetime, **sent: Any
) -> bool:
    """Undo the start of an attempt over its rate limit: its run sends it again at ``until``."""
    return bool(
        _attempt(db, run_id, seq, attempt).update(
            started_at=None, flow=RATE, flow_key=key, wake_at=until, **_UNHELD, **sent
        )
    )


def send_unstarted(
    db: str, run_id: str, seq: int, attempt: int, sent_at: datetime, wake_at: datetime
) -> bool:
    """Undo the start of an attempt a turn started in place: it is sent, for a worker to take."""
    return bool(
        _attempt(db, run_id, seq, attempt).update(started_at=None, enqueued_at=sent_at, wake_at=wake_at)
    )


def admit(db: str, pk: int, now: datetime, redispatch_at: datetime) -> bool:
    """Hand a freed slot to the waiting attempt ``pk``: it holds it from now, sent anew."""
    return bool(
        Checkpoint.objects.using(db)
        .filter(pk=pk, flow=WAITING, status=CheckpointStatus.PENDING)
        .update(flow=HELD, enqueued_at=now, wake_at=redispatch_at)
    )


def _attempt(db: str, run_id: str, seq: int, attempt: int) -> models.QuerySet[Checkpoint]:
    return Checkpoint.objects.using(db).filter(
        run_id=run_id, seq=seq, attempt=attempt, status=CheckpointStatus.PENDING
    )
