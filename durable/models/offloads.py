"""Large payloads kept out of their rows (the claim check, API.md §10): the row that accounts for
each object a payload column refers to in ``DURABLE["OFFLOAD_STORAGE"]``, and the objects' end
(released with the rows that referred to them, purged, or swept as orphans). The column writes
and reads the objects themselves (``models.payloads``).

An object is written, then its ``OffloadedPayload`` row is inserted in the transaction of the row
that refers to it: a rollback leaves an object with no row, which the retention sweep deletes
after ``ORPHAN_GRACE``. Deleting rows that refer to objects marks their rows ``released`` in the
deleting transaction; the objects and those rows go after it commits, or at the next sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.files.storage import Storage, storages
from django.db import connections, models, transaction
from django.db.models import Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact

from .. import clock, codecs, conf
from .base import IDS_PER_STATEMENT, chunked

#: Where in the storage the objects go: one folder, so the orphan sweep lists only durable's.
PREFIX = "durable/payloads"
#: How old an object with no row must be before it counts as orphaned: its row is inserted in a
#: transaction that may still be open (a long turn) when the object is already written.
ORPHAN_GRACE = timedelta(hours=1)


class OffloadedPayload(models.Model):
    """One object in OFFLOAD_STORAGE that a payload column refers to (or did, once released)."""

    name = models.CharField(max_length=100, primary_key=True)
    created_at = models.DateTimeField()
    #: The rows that referred to it were deleted: the object and this row go next.
    released = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["name"], name="durable_offload_released", condition=models.Q(released=True)),
        ]


def storage() -> Storage:
    return storages[conf.get().OFFLOAD_STORAGE]


def any_offloaded(db: str) -> bool:
    """Whether any payload is offloaded (or released and not purged yet) in ``db``."""
    return bool(OffloadedPayload.objects.using(db).exists())


def release(queryset: models.QuerySet[Any], fields: Sequence[str]) -> None:
    """Mark released the objects that ``fields`` of ``queryset``'s rows refer to, in the
    transaction that deletes those rows (call it inside one, before the delete), and delete them
    once it commits; a crash first leaves them marked, and ``purge_released`` finishes. Only rows
    whose column holds a reference are read, and of those only the object's name."""
    db = queryset.db
    if not connections[db].in_atomic_block:
        raise RuntimeError("offloads.release() belongs in the transaction that deletes the rows")
    names: list[str] = []
    for field in fields:
        # A plain text comparison: the JSON field's own ``exact`` would read the right side as JSON.
        kind = Exact(KeyTextTransform(codecs.ENVELOPE_TAG, field), Value(codecs.OFFLOADED_KIND))
        referring = queryset.order_by().filter(kind).annotate(_name=KeyTextTransform("v", field))
        names += referring.values_list("_name", flat=True)
    release_names(names, db)


def release_names(names: list[str], db: str) -> None:
    """``release`` for objects named already (a column about to be rewritten referred to them)."""
    if not names:
        return
    rows = OffloadedPayload.objects.using(db)
    for batch in chunked(names, IDS_PER_STATEMENT):
        rows.filter(name__in=batch).update(released=True)
    transaction.on_commit(lambda: purge(names, db), using=db)


def purge(names: Sequence[str], db: str) -> None:
    """Delete these objects, then their rows: a crash between leaves rows whose objects are
    gone, which the next purge deletes again (deleting a missing object is no error)."""
    where = storage()
    for name in names:
        where.delete(name)
    rows = OffloadedPayload.objects.using(db)
    for batch in chunked(list(names), IDS_PER_STATEMENT):
        rows.filter(name__in=batch, released=True).delete()


def purge_released(db: str, limit: int) -> int:
    """Delete up to ``limit`` released objects and their rows; return how many."""
    names = list(
        OffloadedPayload.objects.using(db).filter(released=True).values_list("name", flat=True)[:limit]
    )
    purge(names, db)
    return len(names)


def delete_orphans(db: str, limit: int) -> int:
    """Delete up to ``limit`` objects under PREFIX that have no row and are older than
    ORPHAN_GRACE: written by a transaction that rolled back. Return how many."""
    where = storage()
    try:
        _, files = where.listdir(PREFIX)
    except FileNotFoundError:
        return 0
    names = [f"{PREFIX}/{file}" for file in files]
    rows = OffloadedPayload.objects.using(db)
    known: set[str] = set()
    for batch in chunked(names, IDS_PER_STATEMENT):
        known |= set(rows.filter(name__in=batch).values_list("name", flat=True))
    before = clock.now() - ORPHAN_GRACE
    deleted = 0
    for name in (name for name in names if name not in known):
        if deleted >= limit:
            break
        # Read the age only of objects with no row: on S3 each one costs a request.
        try:
            old = where.get_modified_time(name) < before
        except FileNotFoundError:  # a concurrent sweep deleted it
            continue
        if old:
            where.delete(name)
            deleted += 1
    return deleted
