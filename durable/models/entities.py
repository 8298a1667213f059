"""Durable entities: one row per (name, key) holding its state, one row per operation sent to it.

The op row is the truth (its Celery message only a prompt): an op is applied when its row leaves
``pending`` in the transaction that writes the entity's new state, under the entity row's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections, models, transaction

from . import offloads
from .payloads import PayloadField


class OpStatus(models.TextChoices):
    PENDING = "pending"
    APPLIED = "applied"
    FAILED = "failed"


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
        locked: Entity | None
        if connections[self.db].features.has_select_for_update:
            locked = self.select_for_update().filter(name=name, key=key).first()
            return locked
        # SQLite has no row locks: a write first takes the database's write lock, so no other
        # applier reads the state until this transaction ends.
        if not self.filter(name=name, key=key).update(updated_at=now):
            return None
        locked = self.filter(name=name, key=key).first()
        return locked

    def write(self, row: Entity, state: Any, version: str, applied: int, last_op: int, now: datetime) -> None:
        """Store the state after ``applied`` more ops, the last of them ``last_op`` (row locked)."""
        self.filter(id=row.id).update(
            state=state,
            version=version,
            applied=models.F("applied") + applied,
            last_op=last_op,
            updated_at=now,
        )


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
    def send(self, op: EntityOp) -> None:
        """Store a new op; one whose (entity, key, op_id) is already stored is dropped.

        One ``INSERT ... ON CONFLICT DO NOTHING``: outside a transaction it commits by itself, in
        one round trip (``bulk_create`` wraps it in BEGIN and COMMIT of its own)."""
        connection = connections[self.db]
        quote = connection.ops.quote_name
        fields = [field for field in EntityOp._meta.concrete_fields if not field.primary_key]
        values = [field.get_db_prep_save(getattr(op, field.attname), connection) for field in fields]
        sql = (
            f"INSERT INTO {quote(EntityOp._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, values)

    def serving(self, namespace: str | None) -> EntityOpQuerySet:
        """The ops sent in ``namespace``; all of them when None (a process that serves them all)."""
        return self if not namespace else self.filter(namespace=namespace)

    def waiting(self, name: str, key: str) -> bool:
        """Whether the key has an op pending."""
        waiting: bool = self.filter(entity=name, key=key, status=OpStatus.PENDING).exists()
        return waiting

    def next_pending(self, name: str, key: str, limit: int) -> list[EntityOp]:
        """The key's pending ops in arrival order (read under the entity's lock)."""
        return list(self.filter(entity=name, key=key, status=OpStatus.PENDING).order_by("id")[:limit])

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
        sender whose prompt is coalesced pays one read-only round trip."""
        connection = connections[self.db]
        quote = connection.ops.quote_name
        at = EntityPrompt._meta.get_field("sent_at").get_db_prep_save(now, connection)
        sql = (
            f"INSERT INTO {quote(EntityPrompt._meta.db_table)} ({quote('name')}, {quote('key')}, "
            f"{quote('sent_at')}) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [name, key, at])
            return int(cursor.rowcount) == 1

    def take(self, name: str, key: str) -> None:
        """An applier starts on the key: later ops need a prompt of their own."""
        self.filter(name=name, key=key).delete()

    def expire(self, before: datetime) -> int:
        """Forget the prompts sent before ``before`` and never taken (lost with the broker's
        messages): the key's next op sends one again."""
        deleted: int = self.filter(sent_at__lt=before).delete()[0]
        return deleted


class EntityPrompt(models.Model):
    """A prompt for an entity key that was sent and not yet taken by an applier.

    While it exists, the senders of the key's new ops send no message of their own: the applier
    of that prompt deletes the row before it reads the pending ops, so it sees every op
    committed before a sender found the row. One message per batch of ops, not one per op.
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
