"""What other code sends to runs: signals and updates to one run, events to every run that waits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models

from .. import conf
from .payloads import PayloadField
from .runs import Run


class SignalQuerySet(models.QuerySet["Signal"]):
    def consume(self, signal_id: int, seq: int) -> bool:
        return bool(self.filter(id=signal_id, consumed_seq__isnull=True).update(consumed_seq=seq))

    def answer(self, update_id: int, run_id: str, reply: Any, now: datetime) -> bool:
        """Record the body's reply to an update of ``run_id``; False if it had one already.

        Called in the transaction of the turn that records the reply's position, so the two
        commit together or not at all: a replayed turn finds the position and writes nothing.
        """
        return bool(
            self.filter(id=update_id, run_id=run_id, is_update=True, replied_at__isnull=True).update(
                reply=reply, replied_at=now
            )
        )

    def carry_over(self, run_id: str, successor_id: str) -> int:
        """Hand the signals and updates ``run_id`` never took to the run that continues it as new:
        sent to the chain before it moved on, they wait for its newest run (an update's caller
        follows its row there for the reply). Called after the continuing run's row is settled:
        a send racing it either committed first (and is carried) or finds the run finished."""
        carried: int = self.filter(run_id=run_id, consumed_seq__isnull=True).update(run_id=successor_id)
        return carried

    def keyed(self, run_id: str, key: str, *, finished: bool = False) -> Signal | None:
        """The signal or update sent to ``run_id`` under idempotency key ``key``, if any. Of a
        ``finished`` run, also one carried over to a run continuing it as new (``carry_over``):
        only a finished run's messages move, so a live run's lookup stays one statement."""
        found: Signal | None = self.filter(run_id=run_id, idempotency_key=key).first()
        while found is None and finished:
            successor = (
                Run.objects.using(self.db).filter(continued_from_id=run_id).values_list("id", flat=True)
            )
            run_id = successor.first()
            if run_id is None:
                return None
            found = self.filter(run_id=run_id, idempotency_key=key).first()
        return found


class Signal(models.Model):
    """A signal (or an update) sent to a run, kept until a wait at position ``consumed_seq`` takes it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=255)
    payload = PayloadField(null=True, blank=True, offload=True)
    created_at = models.DateTimeField()
    consumed_seq = models.PositiveIntegerField(null=True, blank=True)
    #: Sent by ``durable.update`` (its validator accepted it): ``ctx.wait_for_update`` takes only these.
    is_update = models.BooleanField(default=False)
    #: The same key again for the same run is dropped; the unique constraint decides races.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    #: The body's ``ctx.reply`` to this update, and when it was recorded (None: no reply yet).
    reply = PayloadField(null=True, blank=True, offload=True)
    replied_at = models.DateTimeField(null=True, blank=True)

    objects = SignalQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["run", "consumed_seq"], name="durable_signal_unconsumed"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                name="durable_signal_idempotency",
                condition=models.Q(idempotency_key__isnull=False),
            ),
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
        if match and conf.codec() is not None:
            return _first_matching(events, match)
        for i, (key, value) in enumerate((match or {}).items()):
            # An alias per key: a key named like a lookup ("in", "contains") stays a key.
            events = events.alias(**{f"key_{i}": KeyTransform(key, "payload")}).filter(**{f"key_{i}": value})
        oldest: tuple[int, Any] | None = events.order_by("id").values_list("id", "payload").first()
        return oldest


#: The events read at a time when a match is checked outside SQL.
MATCH_BATCH = 200


def _first_matching(events: models.QuerySet[Event], match: dict[str, Any]) -> tuple[int, Any] | None:
    """``oldest_match`` when payloads are encoded: SQL cannot look inside them, so the events
    are read oldest first, a batch at a time, and their decoded payloads compared here (the same
    test as the SQL's: each key of ``match`` holds an equal JSON value)."""
    after = 0
    while True:
        batch = list(events.filter(id__gt=after).order_by("id").values_list("id", "payload")[:MATCH_BATCH])
        for event_id, payload in batch:
            if isinstance(payload, dict) and all(
                key in payload and _same_json(payload[key], value) for key, value in match.items()
            ):
                return event_id, payload
        if len(batch) < MATCH_BATCH:
            return None
        after = batch[-1][0]


def _same_json(stored: Any, wanted: Any) -> bool:
    # JSON equality: true is not 1 there, as True is in Python.
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return type(stored) is type(wanted) and stored == wanted
    return bool(stored == wanted)


class Event(models.Model):
    """A published event, kept for ``EVENT_BUFFER_TTL`` for the waits that come later."""

    #: Arrival order: a wait receives the oldest matching event it has not received yet.
    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    payload = PayloadField(null=True, blank=True)
    created_at = models.DateTimeField()

    objects = EventQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["name", "created_at"], name="durable_event_name"),
            models.Index(fields=["created_at"], name="durable_event_created"),
        ]

    def __str__(self) -> str:
        return f"event {self.name} #{self.id}"
