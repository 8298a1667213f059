"""A value of every standard type durable round-trips (API.md §10, Values), and a view of a value
that tells equal values of different types apart: what the value tests send and compare."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

VALUES = {
    "price": Decimal("12.34"),
    "at": datetime(2026, 12, 3, 7, 15, 30, 123456, tzinfo=UTC),
    "day": date(2026, 12, 3),
    "clock": time(8, 30),
    "lasts": timedelta(hours=1, microseconds=5),
    "id": uuid.UUID("0190c3a8-59b4-7c4e-9a58-2f0c1c1f0e11"),
    "raw": b"\x00\x01\xff",
    "pair": (1, "a"),
    "set": {"x", "y"},
    "frozen": frozenset({1, 2}),
    "nested": [{"price": Decimal("0.10")}],
}


def typed(value: Any) -> Any:
    """A value's types all the way down: equal values of other types compare unequal here."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [typed(item) for item in value]]
    if isinstance(value, (set, frozenset)):
        return [type(value).__name__, sorted(map(repr, value))]
    return [type(value).__name__, repr(value)]
