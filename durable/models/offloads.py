"""Large payloads kept out of their rows (the claim check, API.md §10): the object a payload
column refers to in ``DURABLE["OFFLOAD_STORAGE"]``, and the row that accounts for each object.

An object is written, then its ``OffloadedPayload`` row is inserted in the transaction of the row
that refers to it: a rollback leaves an object with no row, which the retention sweep deletes
after ``ORPHAN_GRACE``. Deleting rows that refer to objects marks their rows ``released`` in the
deleting transaction; the objects and those rows go after it commits, or at the next sweep.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import connections, models, transaction
from django.db.models import Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact

from .. import clock, codecs, conf
from ..errors import PayloadMissing
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


def offloaded(stored: Any, connection: Any) -> Any:
    """What a payload column keeps for ``stored`` (its JSON, sealed or not): ``stored`` itself,
    or, past OFFLOAD_BYTES, a reference to an object holding it, accounted for by a row inserted
    on ``connection`` (so in the transaction of the statement being prepared)."""
    limit = conf.get().OFFLOAD_BYTES
    if limit is None or _surely_within(stored, limit):
        return stored
    data = json.dumps(stored, separators=(",", ":"), ensure_ascii=False).encode()
    if len(data) <= limit:
        return stored
    name = storage().save(f"{PREFIX}/{uuid.uuid4().hex}", ContentFile(data))
    table = connection.ops.quote_name(OffloadedPayload._meta.db_table)
    created = OffloadedPayload._meta.get_field("created_at").get_db_prep_save(clock.now(), connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, created_at, released) VALUES (%s, %s, %s)", [name, created, False]
        )
    fresh = getattr(_watched, "names", None)
    if fresh is not None:
        fresh.append(name)
    return codecs.reference(name, len(data))


_watched = threading.local()


@contextlib.contextmanager
def watching() -> Iterator[list[str]]:
    """The names of the objects written while the statement inside is prepared: a guarded
    statement that then changes no row (a step result delivered twice, a stale attempt's) left
    them referred to by nothing, to be handed to ``release_names``."""
    outer = getattr(_watched, "names", None)
    fresh: list[str] = []
    _watched.names = fresh
    try:
        yield fresh
    finally:
        _watched.names = outer


#: How many parts of a payload ``_surely_within`` looks at before leaving the answer to json.dumps.
_GLANCE = 64


def _surely_within(stored: Any, limit: int) -> bool:
    """True when ``stored``'s JSON is certainly at most ``limit`` bytes, told from a glance at a
    few of its parts: nearly every payload is a number, a short string or a small dict, and
    encoding each one only to learn it is small cost more than the rest of the write."""
    room, stack = limit, [stored]
    for _ in range(_GLANCE):
        if not stack:
            return True
        node = stack.pop()
        kind = type(node)
        if kind is str:
            room -= 6 * len(node) + 2  # \u0001 is the longest a character gets in JSON
        elif kind is int:
            room -= node.bit_length() // 3 + 4  # a digit holds more than 3 bits; a sign, quotes as a key
        elif kind is float or kind is bool or node is None:
            room -= 24
        elif kind is list:
            room -= len(node) + 2
            stack.extend(node)
        elif kind is dict:
            room -= 2 * len(node) + 2
            stack.extend(node)  # the keys: strings, counted as the values are
            stack.extend(node.values())
        else:
            return False
        if room < 0:
            return False
    return not stack


def fetched(reference: dict[str, Any]) -> Any:
    """The JSON a reference's object holds; ``PayloadMissing`` when the object is gone."""
    name = reference["v"]
    try:
        with storage().open(name, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise PayloadMissing(
            f"payload object {name!r} is not in storage {conf.get().OFFLOAD_STORAGE!r}: point "
            'DURABLE["OFFLOAD_STORAGE"] at the storage it was written to, or restore it from a backup',
            details={"name": name},
        ) from None
    return json.loads(data)


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
