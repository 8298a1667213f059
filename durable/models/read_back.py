"""Positions a statement read back as JSON (``json_agg`` of whole positions, beside the write
that woke their run), converted as the ORM would convert the same columns."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from django.db import models

from .payloads import PayloadField, opened


def positions(
    model: Any,  # a model class (mypy, without Django's stubs, takes one for unhashable)
    found: Any,
    fields: tuple[str, ...],
    seq: int,
    ended: dict[str, Any],
) -> list[dict[str, Any]]:
    """The positions a statement read as one JSON array of arrays of ``fields``, converted as the
    ORM would, with position ``seq`` as the same statement left it (``ended``): the reading saw
    the table as the statement began."""
    rows = json.loads(found) if isinstance(found, str) else found
    timed, payloads = _timed(model, fields), _payloads(model, fields)
    read = []
    for values in rows:
        position = dict(zip(fields, values, strict=True))
        for name in timed:
            if position[name] is not None:
                position[name] = datetime.fromisoformat(position[name])
        for name in payloads:
            position[name] = opened(position[name])
        if position.get("seq") == seq:
            position.update({name: value for name, value in ended.items() if name in position})
        read.append(position)
    return read


@functools.cache
def _timed(model: type[models.Model], fields: tuple[str, ...]) -> frozenset[str]:
    """Those of ``fields`` that hold a time (JSON carries them as ISO 8601 text)."""
    return frozenset(name for name in fields if isinstance(model._meta.get_field(name), models.DateTimeField))


@functools.cache
def _payloads(model: type[models.Model], fields: tuple[str, ...]) -> frozenset[str]:
    """Those of ``fields`` that hold a payload (an envelope, under a codec)."""
    return frozenset(name for name in fields if isinstance(model._meta.get_field(name), PayloadField))
