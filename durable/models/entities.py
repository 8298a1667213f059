"""Durable entities: one row per (name, key) holding its state, one row per operation sent to it.

The op row is the truth (its Celery message only a prompt): an op is applied when its row leaves
``pending`` in the transaction that writes the entity's new state, under the entity row's lock.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections, models, transaction

from . import offloads
from .base import all_columns, column_names, insertion, returned, unflushed
from .payloads import PayloadField


class OpStatus(models.TextChoices):
    PENDING = "pending"
    APPLIED = "applied"
    FAILED = "failed"


class Prompt(enum.Enum):
    """What an op's ``send`` statement did for its key's prompt (see ``EntityOpQuerySet.send``)."""

    FOUND = "found"
    CLAIMED = "claimed"
    NOTHING = "nothing"


class EntityQuerySet(models.QuerySet["Entity"]):
    def lock(self, name: str, key: str, initial: Callable[[], Any], version: str, now: datetime) -> Entity:
        """The entity row, created with the state ``initial()`` returns if absent, locked until the transaction
        ends: no other applier of this key reads its state meanwhile. Call inside a transaction."""
        row = self._locked(name, key, now)
        if row is None:
            # Two appliers may both find no row: the unique (name, key) keeps one insert.
            self.bulk_create(
                [
                    Entity(
                        name=name, key=key, state=initial(), version=version, created_at=now, updated_at=now
                    )
                ],
                ignore_conflicts=True,
            )
            row = self._locked(name, key, now)
        assert row is not None
        return row

    def _locked(self, name: str, key: str, now: datetime) -> Entity | None:
        connection = connections[self.db]
        if connection.features.has_select_for_update:
            sql = _statement(self.db, "lock")
            rows = returned(Entity, self.db, sql, [name, key], column_names(Entity))
            return rows[0] if rows else None
        # SQLite has no row locks: a write first takes the database's write lock, so no other
        # applier reads the state until this transaction ends.
        if not self.filter(name=name, key=key).update(updated_at=now):
            return None
        locked: Entity | None = self.filter(name=name, key=key).first()
        return locked

    def write(self, row: Entity, state: Any, version: str, applied: int, last_op: int, now: datetime) -> None:
        """Store the state after ``applied`` more ops, the last of them ``last_op`` (row locked)."""
        connection = connections[self.db]
        meta = Entity._meta
        params = [
            meta.get_field("state").get_db_prep_save(state, connection),
            version,
            applied,
            last_op,
            meta.get_field("updated_at").get_db_prep_save(now, connection),
            row.id,
        ]
        with connection.cursor() as cursor:
            cursor.execute(_statement(self.db, "write"), params)


class Entity(models.Model):
    """The state of one entity key, after the last op applied to it."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    state = PayloadField(null=True, blank=True)
    #: The entity code version that last wrote the state: older code leaves the key alone.
    version = models.CharField(max_length=32, default="1")
    #: How many ops were applied (those that raised included).
    applied = models.BigIntegerField(default=0)
    #: The id of the last op applied.
    last_op = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    objects = EntityQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "key"], name="durable_entity_key")]
        verbose_name_plural = "entities"

    def __str__(self) -> str:
        return f"entity {self.name}:{self.key}"


class EntityOpQuerySet(models.QuerySet["EntityOp"]):
    def send(self, op: EntityOp, now: datetime) -> Prompt:
        """Store a new op; one whose (entity, key, op_id) is already stored is dropped. Return
        what the same statement did for the key's prompt: ``FOUND`` one on its way (the op needs
        no prompt of its own), ``CLAIMED`` a new one (the caller sends its message), or
        ``NOTHING`` (the caller claims one after the commit).

        One ``INSERT ... ON CONFLICT DO NOTHING``, committed by itself outside a transaction.
        There, on PostgreSQL, the statement also reads the key's ``EntityPrompt`` ``FOR KEY
        SHARE``: the applier's take (a ``DELETE``) waits for this commit, so the applier's read
        after its take sees this op. None found, it inserts one (stamped ``now``), committed
        with the op: no second round trip for the claim. A prompt another sender inserted between
        the read and the insert holds no lock for this op: ``NOTHING``, and the caller claims
        after the commit as everywhere else. Inside a transaction that lock would hold the applier
        until the caller commits: the prompt is looked for after the commit instead."""
        sql, params = insertion(EntityOp, self.db, [op])
        connection = connections[self.db]
        alone = (
            connection.vendor == "postgresql"
            and connection.get_autocommit()
            and not connection.in_atomic_block
        )
        with connection.cursor() as cursor:
            if not alone:
                cursor.execute(f"{sql} ON CONFLICT DO NOTHING", params)
                return Prompt.NOTHING
            at = EntityPrompt._meta.get_field("sent_at").get_db_prep_save(now, connection)
            key = [op.entity, op.key]
            cursor.execute(_statement(self.db, "send").format(insert=sql), [*params, *key, *key, at])
            found, claimed = cursor.fetchone()
            return Prompt.FOUND if found else Prompt.CLAIMED if claimed else Prompt.NOTHING

    def serving(self, namespace: str | None) -> EntityOpQuerySet:
        """The ops sent in ``namespace``; all of them when None (a process that serves them all)."""
        return self if not namespace else self.filter(namespace=namespace)

    def waiting(self, name: str, key: str) -> bool:
        """Whether the key has an op pending."""
        with connections[self.db].cursor() as cursor:
            cursor.execute(_statement(self.db, "waiting"), [name, key, OpStatus.PENDING])
            return cursor.fetchone() is not None

    def next_pending(self, name: str, key: str, limit: int) -> list[EntityOp]:
        """The key's pending ops in arrival order (read under the entity's lock)."""
        sql = _statement(self.db, "pending")
        return returned(EntityOp, self.db, sql, [name, key, OpStatus.PENDING, limit], column_names(EntityOp))

    def settle(self, ops: list[EntityOp], now: datetime) -> bool:
        """Mark ``ops`` applied, or failed where they carry an ``error``, with their ``result``,
        in one statement; False unless every one of them was pending.

        Hand-written: Django's ``bulk_update`` builds an expression per op and column, which
        costs more than the statement itself."""
        connection = connections[self.db]
        quote = connection.ops.quote_name
        columns = {name: EntityOp._meta.get_field(name) for name in ("status", "result", "error")}
        for op in ops:
            op.status = OpStatus.FAILED if op.error is not None else OpStatus.APPLIED
            op.applied_at = now
        sets, params = [], []
        for name, field in columns.items():
            values = [field.get_db_prep_save(getattr(op, name), connection) for op in ops]
            if all(value is None for value in values):
                sets.append(f"{quote(name)} = NULL")
                continue
            sets.append(f"{quote(name)} = CASE {quote('id')} {' '.join(['WHEN %s THEN %s'] * len(ops))} END")
            for op, value in zip(ops, values, strict=True):
                params += [op.id, value]
        applied_at = EntityOp._meta.get_field("applied_at").get_db_prep_save(now, connection)
        sql = (
            f"UPDATE {quote(EntityOp._meta.db_table)} SET {', '.join(sets)}, {quote('applied_at')} = %s "
            f"WHERE {quote('id')} IN ({', '.join(['%s'] * len(ops))}) AND {quote('status')} = %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, applied_at, *(op.id for op in ops), OpStatus.PENDING])
            return int(cursor.rowcount) == len(ops)

    def stranded(self, before: datetime, after: int, limit: int) -> list[tuple[int, str, str, str]]:
        """(id, entity, key, namespace) of pending ops sent before ``before``, past id ``after``,
        oldest first."""
        rows = self.filter(status=OpStatus.PENDING, created_at__lte=before, id__gt=after).order_by("id")
        return list(rows.values_list("id", "entity", "key", "namespace")[:limit])

    def prune(self, name: str, key: str, keep: int) -> int:
        """Delete the key's settled ops but the newest ``keep``; return how many went."""
        settled = self.filter(entity=name, key=key).exclude(status=OpStatus.PENDING).order_by("-id")
        cutoff = settled.values_list("id", flat=True)[keep : keep + 1]
        oldest_kept = next(iter(cutoff), None)
        if oldest_kept is None:
            return 0
        with transaction.atomic(using=self.db):
            doomed = settled.filter(id__lte=oldest_kept)
            offloads.release(doomed, ("arg", "result"))
            deleted: int = doomed.delete()[0]
        return deleted


class EntityOp(models.Model):
    """One operation sent to an entity key; ``id`` is its arrival order."""

    id = models.BigAutoField(primary_key=True)
    entity = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    op = models.CharField(max_length=100)
    #: The sender's id for this op: the same id again for this key is dropped.
    op_id = models.CharField(max_length=300)
    arg = PayloadField(null=True, blank=True, offload=True)
    status = models.CharField(max_length=16, choices=OpStatus.choices, default=OpStatus.PENDING)
    result = PayloadField(null=True, blank=True, offload=True)
    error = models.JSONField(null=True, blank=True)
    #: The run and position of a ``ctx.call_entity`` waiting for this op's result.
    caller_run_id = models.CharField(max_length=255, null=True, blank=True)
    caller_seq = models.PositiveIntegerField(null=True, blank=True)
    #: The namespace it was sent in (its caller run's, else the sender's ``DURABLE["NAMESPACE"]``):
    #: its prompts go to that namespace's queue, and that namespace's sweep repairs them.
    namespace = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField()
    applied_at = models.DateTimeField(null=True, blank=True)

    objects = EntityOpQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["entity", "key", "op_id"], name="durable_entityop_once"),
        ]
        indexes = [
            # The applier's "pending ops of this key, in arrival order".
            models.Index(
                fields=["entity", "key", "id"],
                name="durable_entityop_pending",
                condition=models.Q(status=OpStatus.PENDING),
            ),
            # The sweep's "pending ops whose prompt may be lost", oldest first.
            models.Index(
                fields=["id"], name="durable_entityop_stranded", condition=models.Q(status=OpStatus.PENDING)
            ),
        ]
        verbose_name = "entity op"

    def __str__(self) -> str:
        return f"{self.entity}:{self.key} {self.op} ({self.status})"


class EntityPromptQuerySet(models.QuerySet["EntityPrompt"]):
    def claim(self, name: str, key: str, now: datetime) -> bool:
        """Note that a prompt for the key is about to be sent; False when one sent earlier is not
        yet taken by an applier (that one will see ops committed before this call).

        ``ON CONFLICT DO NOTHING`` takes no lock and writes nothing when the row exists, so a
        sender whose prompt is coalesced pays one read-only round trip. Committed without waiting
        for the disk: a crash that forgets a claim only lets the next sender prompt again."""
        connection = connections[self.db]
        at = EntityPrompt._meta.get_field("sent_at").get_db_prep_save(now, connection)
        with connection.cursor() as cursor:
            cursor.execute(_statement(self.db, "claim", unflushed(self.db)), [name, key, at])
            return int(cursor.rowcount) == 1

    def take(self, name: str, key: str) -> None:
        """An applier found nothing waiting on the key: later ops need a prompt of their own. One
        statement, committed by itself outside a transaction (the ORM's ``delete()`` wraps it in
        one), without waiting for the disk: a crash that forgets it leaves a prompt the sweep
        expires."""
        with connections[self.db].cursor() as cursor:
            cursor.execute(_statement(self.db, "take", unflushed(self.db)), [name, key])

    def expire(self, before: datetime) -> int:
        """Forget the prompts sent before ``before`` and never taken (lost with the broker's
        messages): the key's next op sends one again."""
        deleted: int = self.filter(sent_at__lt=before).delete()[0]
        return deleted


class EntityPrompt(models.Model):
    """A prompt for an entity key that was sent and not yet taken by an applier.

    While it exists, the senders of the key's new ops send no message of their own: the applier
    deletes the row only once it finds no op waiting, and reads once more after, so it sees every
    op committed before a sender found the row. One message per busy spell of a key, not per op.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    sent_at = models.DateTimeField()

    objects = EntityPromptQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "key"], name="durable_entityprompt_key")]
        indexes = [models.Index(fields=["sent_at"], name="durable_entityprompt_sent")]
        verbose_name = "entity prompt"

    def __str__(self) -> str:
        return f"prompt {self.name}:{self.key}"


@functools.cache
def _statement(db: str, kind: str, unflushed: str = "") -> str:
    """The entity path's hand-written statements, built once per database: an op and its prompt
    are sent, and a key's ops applied, far more often than the ORM compiles a query cheaply.
    ``unflushed``: ``base.unflushed`` for a claim or a take, in autocommit on PostgreSQL."""
    quote = connections[db].ops.quote_name
    entity, op, prompt = (quote(m._meta.db_table) for m in (Entity, EntityOp, EntityPrompt))
    mine = f"{quote('name')} = %s AND {quote('key')} = %s"
    ops_of_key = f"{quote('entity')} = %s AND {quote('key')} = %s AND {quote('status')} = %s"
    statements = {
        "lock": f"SELECT {all_columns(Entity, db)} FROM {entity} WHERE {mine} FOR UPDATE",
        "write": (
            f"UPDATE {entity} SET {quote('state')} = %s, {quote('version')} = %s, "
            f"{quote('applied')} = {quote('applied')} + %s, {quote('last_op')} = %s, "
            f"{quote('updated_at')} = %s WHERE {quote('id')} = %s"
        ),
        "waiting": f"SELECT 1 FROM {op} WHERE {ops_of_key} LIMIT 1",
        "pending": (
            f"SELECT {all_columns(EntityOp, db)} FROM {op} WHERE {ops_of_key} ORDER BY {quote('id')} LIMIT %s"
        ),
        "send": (
            "WITH sent AS ({insert} ON CONFLICT DO NOTHING RETURNING 1), "
            f"found AS (SELECT 1 FROM {prompt} WHERE {mine} FOR KEY SHARE), "
            f"claimed AS (INSERT INTO {prompt} ({quote('name')}, {quote('key')}, {quote('sent_at')}) "
            "SELECT %s, %s, %s WHERE NOT EXISTS (SELECT FROM found) ON CONFLICT DO NOTHING RETURNING 1) "
            "SELECT EXISTS (SELECT FROM found), EXISTS (SELECT FROM claimed)"
        ),
        "claim": (
            f"INSERT INTO {prompt} ({quote('name')}, {quote('key')}, {quote('sent_at')}) "
            + (f"SELECT %s, %s, %s {unflushed}" if unflushed else "VALUES (%s, %s, %s)")
            + " ON CONFLICT DO NOTHING"
        ),
        "take": f"DELETE FROM {prompt} {unflushed.replace('FROM', 'USING', 1)}WHERE {mine}",
    }
    return statements[kind]
