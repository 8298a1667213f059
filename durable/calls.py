"""What the public calls share: their arguments checked before anything is stored, and the
pace at which a caller that waits polls."""

from __future__ import annotations

from typing import Any

from . import conf, guards
from .values import stored

#: The first pause of a caller that polls for a run's end; each next one is longer, up to LAST_POLL.
FIRST_POLL = 0.005
#: The longest pause between two polls: a caller waits for a result by reading one indexed row.
LAST_POLL = 0.05


def next_poll(pause: float) -> float:
    return min(pause * 1.5, LAST_POLL)


def column_length(model: str, field: str) -> int:
    """The ``max_length`` of a durable model's column: what a string stored there may hold."""
    from . import models

    return models.column_length(model, field)


def payload_of(value: Any, what: str) -> Any:
    """``value`` as stored: tagged JSON (``durable.values``), refused before anything is written."""
    return stored(value, what=what, max_bytes=conf.get().MAX_PAYLOAD_BYTES)


def run_id_of(run_id: Any, *, reserved_ok: bool = True) -> str:
    """A run id to look up (any existing id) or, with ``reserved_ok=False``, one a caller picks."""
    return guards.run_id(run_id, max_length=column_length("Run", "id"), reserved_ok=reserved_ok)


def name_of(value: Any, field: str, model: str) -> str:
    return guards.text(value, field, max_length=column_length(model, "name"), kind="name")
