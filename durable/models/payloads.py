"""The column type of every payload (inputs, outputs, messages, entity state): JSON, wrapped in
an envelope by ``DURABLE["CODEC"]`` when one is set, replaced by a reference to an object past
``DURABLE["OFFLOAD_BYTES"]`` in columns written once, and unwrapped on every read."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.core.files.base import ContentFile
from django.db import models
from django.db.models.expressions import Expression

from .. import clock, codecs, conf
from ..errors import PayloadMissing
from .offloads import PREFIX, OffloadedPayload, storage


class PayloadField(models.JSONField):
    """A ``JSONField`` whose writes go through the configured codec.

    With no codec the column holds exactly the JSON it always held; with one it holds
    ``{"__durable__": "encoded", "v": "<base64 of the encoded JSON>"}``. A plain row reads back
    under a codec as it is, so turning one on rewrites nothing. Every write path prepares values
    with ``get_db_prep_save`` (the ORM's and the raw statements of ``models.base``), and every read
    converts with ``from_db_value``, so the codec applies wherever the column is written or read.
    SQL can no longer look inside an encoded column: query plain columns instead.

    With ``offload=True``, a payload whose JSON (or envelope) is larger than OFFLOAD_BYTES goes
    to OFFLOAD_STORAGE and the column keeps ``{"__durable__": "offloaded", "v": "<object name>",
    "n": <bytes>}`` (accounted for by an ``OffloadedPayload`` row). Only columns written once take it: a column
    rewritten in place would leave its old object behind with nothing that refers to it.
    """

    if TYPE_CHECKING:
        # What an instance's attribute holds (Django's model metaclass puts a descriptor there):
        # a payload, any JSON value, not this field.
        def __get__(self, instance: Any, owner: Any) -> Any: ...

    def __init__(self, *args: Any, offload: bool = False, **kwargs: Any) -> None:
        self.offload = offload
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        # The column is the JSON column it always was (the codec is behaviour, not schema):
        # migrations see a JSONField, so switching to this class altered no table.
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs

    def get_db_prep_save(self, value: Any, connection: Any) -> Any:
        if value is not None and not isinstance(value, Expression):
            codec = conf.codec()
            if codec is not None:
                value = codecs.seal(value, codec)
            if self.offload:
                value = offloaded(value, connection)
        return super().get_db_prep_save(value, connection)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return opened(super().from_db_value(value, expression, connection))


def opened(stored: Any) -> Any:
    """The payload a column's JSON holds (``stored`` itself unless it is an envelope);
    ``PayloadUndecodable`` when no configured codec opens it, ``PayloadMissing`` when its
    offloaded object is gone. For JSON read past the field (``json_agg`` of whole positions)."""
    if codecs.is_offloaded(stored):
        stored = fetched(stored)
    return codecs.unseal(stored, conf.codec()) if codecs.is_sealed(stored) else stored


# -- past OFFLOAD_BYTES: the object the column refers to ---------------------------------


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
