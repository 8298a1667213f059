"""A position of a run's history, and the guarded transitions of a step attempt."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, models, transaction
from django.db.models import Exists

from ..statuses import UNFINISHED, CheckpointStatus, FlowState, RunStatus
from . import offloads, payloads, read_back
from .base import (
    IDS_PER_STATEMENT,
    RETRYABLE,
    all_columns,
    chunked,
    column_names,
    insert,
    insertion,
    instances,
    returned,
    skip_locked,
    unflushed,
    update_where,
    updating,
    values_where,
)
from .beats import Beats
from .fans import Fan
from .payloads import PayloadField
from .runs import Claim, Run

HELD, WAITING, RATE = FlowState.HELD, FlowState.WAITING, FlowState.RATE

#: A settled or failed attempt is held by no one.
_UNHELD: dict[str, Any] = {"held_by": None, "held_until": None}
#: ... and holds no slot of a limit any more (its key stays, so the slot can be handed on).
_ENDED: dict[str, Any] = {**_UNHELD, "flow": None}


@dataclass
class Recorded:
    """What ``complete_and_wake`` did: whether it recorded the result; the run's queue, if it woke
    the run (None: the run had finished); the run, if the claim took its lease; and its
    positions, if the same statement read them for the turn (each a dict of the fields asked)."""

    done: bool
    queue: str | None = None
    claimed: Run | None = None
    history: list[dict[str, Any]] | None = None


def _pending(run_id: str, seq: int, attempt: int) -> dict[str, Any]:
    """Where this attempt is, while it is the position's pending one."""
    return {"run": run_id, "seq": seq, "status": CheckpointStatus.PENDING, "attempt": attempt}


def _completed(output: Any, now: datetime) -> dict[str, Any]:
    fields = {"status": CheckpointStatus.COMPLETED, "output": output, "error": None}
    return {**fields, "wake_at": None, "finished_at": now, **_ENDED}


class CheckpointQuerySet(Beats["Checkpoint"]):
    def serving(self, namespace: str | None) -> CheckpointQuerySet:
        """The positions of the runs of ``namespace``; all of them when None."""
        if not namespace:
            return self
        # A subquery, not a join: a sweep's FOR UPDATE then locks checkpoints only, never runs.
        served: CheckpointQuerySet = self.filter(
            run_id__in=Run.objects.filter(namespace=namespace).values("id")
        )
        return served

    def begin(self, run_id: str, seq: int, attempt: int, token: str | None, now: datetime) -> bool:
        """A worker picked up this attempt of a Celery task used as a step; False if the token is
        not the attempt's, or the attempt is stale or already settled."""
        if not token:  # an attempt between two sends has none: ``token=None`` would match it
            return False
        return bool(self._attempt(run_id, seq, attempt).filter(token=token).update(started_at=now))

    def take(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        token: str | None,
        holder: str,
        now: datetime,
        until: datetime,
        namespace: str | None = None,
    ) -> Checkpoint | None:
        """Start this attempt, held by ``holder`` until ``until``, and return its row, in one
        statement. None when the message is not the one durable sent for it (token), the attempt
        is stale, settled or already started (a redelivery never runs an attempt twice as
        itself), or its run has finished or (with ``namespace``) is of another namespace."""
        taking = self.taking(run_id, seq, attempt, token, holder, now, until, namespace=namespace)
        taken = returned(Checkpoint, self.db, *taking, column_names(Checkpoint))
        return taken[0] if taken else None

    def taking(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        token: str | None,
        holder: str,
        now: datetime,
        until: datetime,
        returning: str | None = None,
        namespace: str | None = None,
    ) -> tuple[str, list[Any]]:
        """``take``'s statement (``RETURNING`` ``returning``, else every column) and its parameters."""
        ops = connections[self.db].ops
        at = ops.adapt_datetimefield_value
        sql = (
            f"UPDATE {ops.quote_name(Checkpoint._meta.db_table)} SET started_at = %s, held_by = %s, "
            f"held_until = %s {unflushed(self.db)}"
            f"WHERE run_id = %s AND seq = %s AND status = '{CheckpointStatus.PENDING}' AND attempt = %s "
            # ``token = NULL`` is never true: a message without a token takes nothing.
            "AND enqueued_at IS NOT NULL AND started_at IS NULL AND token = %s "
            # An attempt in line for a slot or a rate token starts only once it is sent again.
            f"AND (flow IS NULL OR flow = '{FlowState.HELD}') AND EXISTS ("
            f"SELECT 1 FROM {ops.quote_name(Run._meta.db_table)} WHERE id = %s AND status IN (%s, %s, %s)"
            f"{' AND namespace = %s' if namespace else ''}) RETURNING {returning or all_columns(Checkpoint, self.db)}"
        )
        params = [
            at(now),
            holder,
            at(until),
            run_id,
            seq,
            attempt,
            token or None,
            run_id,
            *UNFINISHED,
            *([namespace] if namespace else []),
        ]
        return sql, params

    def renew_hold(self, run_id: str, seq: int, attempt: int, holder: str, until: datetime) -> bool:
        """Extend the hold of a running attempt; False when it ended or was declared lost."""
        return bool(self._attempt(run_id, seq, attempt).filter(held_by=holder).update(held_until=until))

    def await_completion(self, run_id: str, seq: int, attempt: int, holder: str, now: datetime) -> bool:
        """Let go of an attempt whose step raised CompleteLater without its being judged lost:
        no process holds it any more, and only its timeout or ``complete_step`` with its token
        settles it. False when it was settled meanwhile (completed early) or declared lost.
        The let-go is the attempt's last sign of life from its body: a ``heartbeat_timeout``
        counts from it, so the system handed the token has the whole timeout to beat first."""
        return bool(
            self._attempt(run_id, seq, attempt)
            .filter(held_by=holder)
            .update(**_UNHELD, last_heartbeat_at=now)
        )

    def lapsed(self, now: datetime, limit: int) -> list[str]:
        """Runs with a started attempt whose holder stopped renewing it: its process died, or
        its result could not be recorded. Each such hold is let go (so it is reported once) and
        the turn that wakes counts the attempt as lost."""
        rows = self.filter(held_by__isnull=False, held_until__lt=now, status=CheckpointStatus.PENDING)
        found = list(skip_locked(rows.order_by("held_until")).values_list("id", "run_id")[:limit])
        self.filter(id__in=[pk for pk, _ in found], held_until__lt=now).update(held_by=None)
        return sorted({run_id for _, run_id in found})

    def let_go(self, holder_prefix: str, stale_before: datetime, now: datetime, limit: int) -> list[str]:
        """Runs whose attempts a dead predecessor of this instance held (holds not renewed since
        ``stale_before``): the holds lapse now, and the turn that wakes counts them as lost."""
        rows = self.filter(
            held_by__startswith=holder_prefix, held_until__lt=stale_before, status=CheckpointStatus.PENDING
        )
        found = list(rows.values_list("id", "run_id")[:limit])
        self.filter(id__in=[pk for pk, _ in found], held_until__lt=stale_before).update(held_until=now)
        return sorted({run_id for _, run_id in found})

    def unsend(self, run_ids: list[str], *, fresh_budget: bool = False) -> int:
        """Forget that the unstarted attempts of these runs were sent, so their next turn sends
        them again with new tokens (the old messages, if any, are then refused). For runs whose
        last sender may have died between its commit and its publish; ``fresh_budget``: an
        operator's call, which gives them STEP_REDISPATCH_LIMIT sends again."""
        forget: dict[str, Any] = {"enqueued_at": None, "wake_at": None, "token": None}
        if fresh_budget:
            forget["redispatches"] = 0
        unsent = 0
        for batch in chunked(run_ids, IDS_PER_STATEMENT):  # an operator may name any number
            unsent += self.filter(
                run_id__in=batch,
                kind="step",
                status=CheckpointStatus.PENDING,
                enqueued_at__isnull=False,
                started_at__isnull=True,
            ).update(**forget)
        return unsent

    def complete(self, run_id: str, seq: int, attempt: int, output: Any, now: datetime) -> bool:
        return self._end(run_id, seq, attempt, _completed(output, now))

    def fail(self, run_id: str, seq: int, attempt: int, error: dict[str, Any], now: datetime) -> bool:
        fields = {"status": CheckpointStatus.FAILED, "error": error, "wake_at": None, "finished_at": now}
        return self._end(run_id, seq, attempt, {**fields, **_ENDED})

    def _end(self, run_id: str, seq: int, attempt: int, fields: dict[str, Any]) -> bool:
        with payloads.watching() as fresh:
            ended = update_where(Checkpoint, self.db, fields, _pending(run_id, seq, attempt)) == 1
        if not ended:
            offloads.release_names(fresh, self.db)
        return ended

    def complete_and_wake(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        output: Any,
        now: datetime,
        redrive_at: datetime,
        claim: Claim | None,
        history: tuple[str, ...] = (),
    ) -> Recorded:
        """``complete`` the attempt and, if it was, ``wake`` its run (``wake_and_claim`` given
        ``claim``), in one commit.

        On PostgreSQL one statement (its run's UPDATE conditional on the attempt's, in a
        data-modifying WITH), so the result, the wake and the claim cost one round trip; given
        ``history`` (fields) and a claim that took the lease, the statement also reads the run's
        positions for its turn, unless another wake landed while it waited for the run's row."""
        runs = Run.objects.using(self.db)
        connection = connections[self.db]
        if connection.vendor != "postgresql":
            with transaction.atomic(using=self.db):
                if not self.complete(run_id, seq, attempt, output, now):
                    return Recorded(False)
                if claim is None:
                    return Recorded(True, runs.wake(run_id, now, redrive_at))
                return Recorded(True, *runs.wake_and_claim(run_id, now, redrive_at, claim))
        ended = _completed(output, now)
        with payloads.watching() as fresh:
            record, params = updating(Checkpoint, self.db, ended, _pending(run_id, seq, attempt))
        wake, wake_params = runs.waking(
            run_id, now, redrive_at, claim, only_if="EXISTS (SELECT 1 FROM recorded)"
        )
        params += wake_params
        reading = ""
        if claim is not None and history:
            ops = connection.ops
            columns = ", ".join(ops.quote_name(Checkpoint._meta.get_field(name).column) for name in history)
            # The subqueries see the tables as the statement began: the run's wakes then, and its
            # positions then. Only if this claim's wake is the one since are they the turn's.
            reading = (
                ", CASE WHEN woken.locked_by = %s AND woken.wakes = "
                f"(SELECT wakes FROM {ops.quote_name(Run._meta.db_table)} WHERE id = %s) + 1 THEN "
                f"(SELECT json_agg(json_build_array({columns}) ORDER BY seq) "
                f"FROM {ops.quote_name(Checkpoint._meta.db_table)} WHERE run_id = %s) END AS durable_history"
            )
            params += [claim.owner, run_id, run_id]
        sql = (
            f"WITH recorded AS ({record} RETURNING 1), woken AS ({wake}) "
            f"SELECT (SELECT COUNT(*) FROM recorded) AS durable_recorded, woken.*{reading} "
            "FROM (SELECT 1) AS one LEFT JOIN woken ON TRUE"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            names = tuple(column[0] for column in cursor.description)
            (row,) = cursor.fetchall()
        if not row[0]:
            offloads.release_names(fresh, self.db)
            return Recorded(False)
        woken = instances(Run, self.db, names, [row]) if row[names.index("id")] is not None else []
        done = Recorded(True, *runs.woken_as(woken[0] if woken else None, claim))
        if reading and done.claimed is not None and row[-1] is not None:
            done.history = read_back.positions(
                Checkpoint, row[-1], history, seq, {**ended, "status": CheckpointStatus.COMPLETED}
            )
        return done

    def complete_and_settle(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        output: Any,
        now: datetime,
        version: str,
        settled: dict[str, Any],
        inserting: Checkpoint | None,
    ) -> tuple[bool, bool]:
        """``complete`` the attempt and, if it was and the run's row is still ``version`` (suspended),
        settle the run with ``settled`` and insert ``inserting`` (if any), in one statement
        (PostgreSQL; see ``result_and_turn``): (whether the result was recorded, whether the run
        was settled with it)."""
        record, params = updating(
            Checkpoint, self.db, _completed(output, now), _pending(run_id, seq, attempt)
        )
        fields = {
            **settled,
            "recovery_attempts": 0,
            "locked_by": None,
            "locked_until": None,
            "updated_at": now,
        }
        fence = " AND xmin::text = %s AND EXISTS (SELECT 1 FROM recorded)"
        settle, settle_params = updating(
            Run, self.db, fields, {"id": run_id, "status": RunStatus.SUSPENDED}, fence
        )
        adding, adding_params = "", list[Any]()
        if inserting is not None:
            adding, adding_params = insertion(Checkpoint, self.db, [inserting], source="FROM settled")
            adding = f", added AS ({adding} RETURNING 1)"
        sql = (
            f"WITH recorded AS ({record} RETURNING 1), settled AS ({settle} RETURNING 1){adding} "
            "SELECT (SELECT COUNT(*) FROM recorded), (SELECT COUNT(*) FROM settled)"
        )
        with connections[self.db].cursor() as cursor:
            cursor.execute(sql, [*params, *settle_params, version, *adding_params])
            recorded, settled_count = cursor.fetchone()
        return bool(recorded), bool(settled_count)

    def retry_at(self, run_id: str, seq: int, attempt: int, error: dict[str, Any], wake_at: datetime) -> bool:
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
                redispatches=0,
                **_ENDED,
            )
        )

    def untaken_queues(self, sent_before: datetime) -> list[str]:
        """The queues holding durable step attempts sent before ``sent_before`` and not taken."""
        return sorted(set(self._untaken(sent_before).values_list("queue", flat=True).distinct()))

    def _untaken(self, sent_before: datetime) -> CheckpointQuerySet:
        # Celery tasks used as steps are left out: their workers may not run durable's probe.
        untaken: CheckpointQuerySet = (
            self.filter(
                status=CheckpointStatus.PENDING,
                started_at__isnull=True,
                enqueued_at__isnull=False,
                enqueued_at__lt=sent_before,
                kind="step",
            )
            .filter(models.Q(flow__isnull=True) | models.Q(flow=HELD))
            .exclude(task=True)
        )
        return untaken

    def overtaken(self, queue: str, sent_before: datetime, limit: int) -> list[str]:
        """Forget that the attempts of ``queue`` sent before ``sent_before`` and still not taken
        were sent (a later message of that queue was taken: theirs were lost), counting it, a
        batch at a time; return their runs, whose next turn sends them again."""
        rows = self._untaken(sent_before).filter(queue=queue)
        found = list(skip_locked(rows.order_by("enqueued_at")).values_list("id", "run_id")[:limit])
        self.filter(id__in=[pk for pk, _ in found], started_at__isnull=True).update(
            enqueued_at=None, wake_at=None, token=None, redispatches=models.F("redispatches") + 1
        )
        return sorted({run_id for _, run_id in found})

    def rewrite(
        self, run_id: str, seq: int, expected: tuple[str, int], *, owner: str | None = None, **fields: Any
    ) -> bool:
        """Write a turn's new view of a position, if it is still in the state the turn read
        (and, given ``owner``, only while that turn still holds the run's lease)."""
        if owner is None:
            status, attempt = expected
            where = {"run": run_id, "seq": seq, "status": status, "attempt": attempt}
            return update_where(Checkpoint, self.db, fields, where) == 1
        with connections[self.db].cursor() as cursor:
            cursor.execute(*self.rewriting(run_id, seq, expected, owner, fields))
            return int(cursor.rowcount) == 1

    def rewriting(
        self, run_id: str, seq: int, expected: tuple[str, int], owner: str, fields: dict[str, Any]
    ) -> tuple[str, list[Any]]:
        """``rewrite``'s statement under ``owner``'s lease, and its parameters."""
        status, attempt = expected
        where = {"run": run_id, "seq": seq, "status": status, "attempt": attempt}
        runs = connections[self.db].ops.quote_name(Run._meta.db_table)
        fence = f" AND EXISTS (SELECT 1 FROM {runs} WHERE id = %s AND locked_by = %s)"
        sql, params = updating(Checkpoint, self.db, fields, where, fence)
        return sql, [*params, run_id, owner]

    def rewrite_and_insert(self, rewriting: tuple[str, list[Any]], row: Checkpoint) -> bool:
        """Run ``rewriting`` (an UPDATE of one position, fenced as ``rewriting()`` makes it) and
        insert ``row`` only if it changed that position: one autocommitted statement on
        PostgreSQL (a data-modifying WITH), elsewhere in the caller's transaction or one of its
        own (SQLite's write lock keeps the fence until it commits). False, nothing written, when
        the position changed or the lease was lost."""
        rewrite, params = rewriting
        if connections[self.db].vendor != "postgresql":
            with transaction.atomic(using=self.db, savepoint=False), connections[self.db].cursor() as cursor:
                cursor.execute(rewrite, params)
                if cursor.rowcount != 1:
                    return False
                insert(Checkpoint, self.db, [row])
                return True
        adding, adding_params = insertion(Checkpoint, self.db, [row], source="FROM rewritten")
        with connections[self.db].cursor() as cursor:
            cursor.execute(f"WITH rewritten AS ({rewrite} RETURNING 1) {adding}", [*params, *adding_params])
            return int(cursor.rowcount) == 1

    def history(self, run_id: str, fields: tuple[str, ...]) -> list[tuple[Any, ...]]:
        """``fields`` of ``run_id``'s positions in order, by one plain statement (a turn's read)."""
        return values_where(Checkpoint, self.db, fields, {"run": run_id}, ("seq",))

    def add(self, rows: list[Checkpoint]) -> None:
        """Insert new positions (their ids are not read back): one statement, or for a fan wider
        than ``rows_per_insert`` one per slice, in the caller's transaction."""
        insert(Checkpoint, self.db, rows)

    def insert_fenced(self, row: Checkpoint, owner: str) -> bool:
        """Insert ``row`` in one statement, only while ``owner`` holds its run's lease."""
        connection = connections[self.db]
        runs = connection.ops.quote_name(Run._meta.db_table)
        fence = f"WHERE EXISTS (SELECT 1 FROM {runs} WHERE id = %s AND locked_by = %s)"
        sql, params = insertion(Checkpoint, self.db, [row], source=fence)
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, row.run_id, owner])
            return int(cursor.rowcount) == 1

    def fan_closed(self, run_id: str, fan: int, left: int | None = None) -> bool:
        """No member of the fan is still pending (asked after a member's result committed), by
        its count (``left``: what ``Fan.objects.leave`` said of the member's shard; see
        models/fans.py), else by asking the members, which reads past every settled one's entry."""
        if left is not None and left > 0:
            return False
        if (closed := Fan.objects.using(self.db).closed(run_id, fan) if left == 0 else None) is not None:
            return bool(closed)
        return not self.filter(run_id=run_id, status=CheckpointStatus.PENDING, fan=fan).exists()

    def settle_child(
        self, run_id: str, seq: int, status: str, output: Any, error: Any, now: datetime
    ) -> bool:
        """Record at position ``seq`` of ``run_id`` how the child started there ended."""
        return bool(
            self.filter(run_id=run_id, seq=seq, kind="child", status=CheckpointStatus.PENDING).update(
                status=status, output=output, error=error, finished_at=now
            )
        )

    def settle_entity_call(
        self, run_id: str, seq: int, status: str, output: Any, error: Any, now: datetime
    ) -> bool:
        """Record at position ``seq`` of ``run_id`` how the entity op it called ended."""
        return bool(
            self.filter(run_id=run_id, seq=seq, kind="entity", status=CheckpointStatus.PENDING).update(
                status=status, output=output, error=error, finished_at=now, wake_at=None
            )
        )

    def reattempt(self, run_id: str, seqs: list[int]) -> None:
        """Give the failed positions ``seqs`` of a failed, dead or cancelled run a fresh attempt
        (call before the run is reopened): a child position waits again for its run, retried
        with it; any other position is forgotten, so the next turn replays it as new."""
        ended = Exists(Run.objects.filter(id=run_id, status__in=RETRYABLE))
        # Forgetting a count is always safe: the fans' members are asked instead.
        Fan.objects.using(self.db).forget(run_id)
        for batch in chunked(seqs, IDS_PER_STATEMENT):  # a wide fan's failures, a slice at a time
            positions = self.filter(ended, run_id=run_id, seq__in=batch)
            positions.filter(kind="child", status=CheckpointStatus.FAILED).update(
                status=CheckpointStatus.PENDING, error=None, finished_at=None
            )
            forgotten = positions.exclude(kind="child")
            offloads.release(forgotten, ("input", "output"))
            forgotten.delete()


class Checkpoint(models.Model):
    """One position of a run's history: a step, timer, signal wait or recorded value."""

    # No index of its own: the (run, seq) constraint's index serves lookups by run, and a plain
    # run index tempts PostgreSQL into scanning a whole fan's rows to find one position.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16)
    name = models.CharField(max_length=255)
    status = models.CharField(max_length=16, default=CheckpointStatus.PENDING)
    attempt = models.PositiveIntegerField(default=1)
    queue = models.CharField(max_length=200, blank=True, default="")
    input = PayloadField(null=True, blank=True, offload=True)
    output = PayloadField(null=True, blank=True, offload=True)
    error = models.JSONField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    progress = PayloadField(null=True, blank=True)
    #: When the worker sent the beat message whose ``progress`` is kept: two pool processes may
    #: take an attempt's beats out of order, and the older one must not overwrite the newer.
    progress_at = models.DateTimeField(null=True, blank=True)
    #: First position of the fan (ctx.all / all_settled) this member belongs to.
    fan = models.PositiveIntegerField(null=True, blank=True)
    #: The fan resumes the run at its first failure (ctx.all), not only once closed.
    fail_fast = models.BooleanField(default=False)
    #: The secret of the attempt sent last: only a message carrying it may start or settle it.
    token = models.CharField(max_length=64, null=True, blank=True)
    #: The process running a dispatched attempt, and until when its hold lasts unless renewed.
    held_by = models.CharField(max_length=255, null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)
    #: Under a fleet-wide limit: "held" (the attempt has a slot), "waiting" (in line for one) or
    #: "rate" (waiting until ``wake_at`` for a rate token); the gate key, and the place in line.
    flow = models.CharField(max_length=16, null=True, blank=True)
    flow_key = models.CharField(max_length=255, null=True, blank=True)
    flow_seq = models.BigIntegerField(null=True, blank=True)
    #: How many times this attempt was sent again because its message was lost or never taken.
    redispatches = models.PositiveIntegerField(default=0)
    #: A Celery task used as a step (its worker may not run durable's probe). A column of its own
    #: because the input that also says so may be encoded at rest, where SQL cannot look.
    task = models.BooleanField(default=False)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="durable_checkpoint_position"),
        ]
        indexes = [
            # "Is any member of this fan still pending", in one probe; fan before status, so a lookup
            # of one position never prefers it to the (run, seq) index.
            # Partial: a position outside a fan writes no entry here when its status changes.
            models.Index(
                fields=["run", "fan", "status"],
                name="durable_checkpoint_fan",
                condition=models.Q(fan__isnull=False),
            ),
            # The runs waiting for an event of this name, found by publish_event().
            models.Index(
                fields=["name", "status"],
                name="durable_checkpoint_event_wait",
                condition=models.Q(kind="event"),
            ),
            # The attempts holding or waiting for the slots of a limited key.
            models.Index(
                fields=["flow_key", "flow", "flow_seq"],
                name="durable_checkpoint_flow",
                condition=models.Q(flow__isnull=False),
            ),
            # Attempts sent and not taken yet, per queue: the orphan sweep's probes look for them.
            # ``kind`` is in the condition because the take never says it: a take's guards match
            # the rest of the condition, and a planner without statistics on a fresh fan's rows
            # would read the whole index (every untaken member) for each take.
            models.Index(
                fields=["queue", "enqueued_at"],
                name="durable_checkpoint_untaken",
                condition=models.Q(
                    status=CheckpointStatus.PENDING,
                    started_at__isnull=True,
                    enqueued_at__isnull=False,
                    kind="step",
                ),
            ),
            # Held attempts whose holder stopped renewing, found by the orphan sweep.
            models.Index(
                fields=["held_until"],
                name="durable_checkpoint_held",
                condition=models.Q(held_by__isnull=False),
            ),
        ]
        ordering = ["run", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind} {self.name} ({self.status})"
