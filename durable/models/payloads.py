"""The column type of every payload (inputs, outputs, messages, entity state): JSON, wrapped in
an envelope by ``DURABLE["CODEC"]`` when one is set, replaced by a reference to an object past
``DURABLE["OFFLOAD_BYTES"]`` in columns written once, and unwrapped on every read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models.expressions import Expression

from .. import codecs, conf
from . import offloads


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
    "n": <bytes>}`` (see ``models.offloads``). Only columns written once take it: a column
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
                value = offloads.offloaded(value, connection)
        return super().get_db_prep_save(value, connection)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return opened(super().from_db_value(value, expression, connection))


def opened(stored: Any) -> Any:
    """The payload a column's JSON holds (``stored`` itself unless it is an envelope);
    ``PayloadUndecodable`` when no configured codec opens it, ``PayloadMissing`` when its
    offloaded object is gone. For JSON read past the field (``json_agg`` of whole positions)."""
    if codecs.is_offloaded(stored):
        stored = offloads.fetched(stored)
    return codecs.unseal(stored, conf.codec()) if codecs.is_sealed(stored) else stored
