"""What ``bench/payloads.py`` runs: ten steps passing one value along, plain or typed, and one
step returning a large text."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import durable

PLAIN10 = "bench.payloads.plain10"
TYPED10 = "bench.payloads.typed10"
MEGABYTE1 = "bench.payloads.megabyte1"


@durable.register_type
@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int


def plain_value() -> dict[str, Any]:
    """An order as plain JSON: what every value was before tags."""
    return {
        "total": "12.34",
        "placed": "2026-12-03T07:15:30+00:00",
        "customer": "0190c3a8-59b4-7c4e-9a58-2f0c1c1f0e11",
        "line": {"sku": "book", "quantity": 2},
    }


def typed_value() -> dict[str, Any]:
    """The same order as Django code holds it."""
    return {
        "total": Decimal("12.34"),
        "placed": datetime(2026, 12, 3, 7, 15, 30, tzinfo=UTC),
        "customer": uuid.UUID("0190c3a8-59b4-7c4e-9a58-2f0c1c1f0e11"),
        "line": Line("book", 2),
    }


@durable.step(name="bench.payloads.pass_on")
def pass_on(value: Any) -> Any:
    return value


@durable.step(name="bench.payloads.typed_pass_on")
def typed_pass_on(value: dict[str, Any]) -> dict[str, Any]:
    return value


@durable.step(name="bench.payloads.text")
def text(size: int) -> str:
    return "x" * size


@durable.workflow(name=PLAIN10)
def plain10(ctx: durable.Context, value: Any) -> Any:
    for _ in range(10):
        value = ctx.step(pass_on, value)
    return value


@durable.workflow(name=TYPED10)
def typed10(ctx: durable.Context, value: dict[str, Any]) -> dict[str, Any]:
    for _ in range(10):
        value = ctx.step(typed_pass_on, value)
    return value


@durable.workflow(name=MEGABYTE1)
def megabyte1(ctx: durable.Context, size: int) -> int:
    return len(ctx.step(text, size))
