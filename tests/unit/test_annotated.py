"""Values shaped by annotations (API.md §10, Values): what reaches a reader as plain JSON comes
back as the type its annotation names; what the annotation does not describe comes back as is."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

import pydantic
import pytest

from durable.annotated import shaped, signature


@dataclasses.dataclass
class Line:
    sku: str
    price: Decimal


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    lines: list[Line]
    placed: datetime
    note: str | None = None


class Point(NamedTuple):
    x: int
    y: Decimal


class Colour(enum.Enum):
    RED = "red"


class Customer(pydantic.BaseModel):
    name: str
    since: date


ID = "0190c3a8-59b4-7c4e-9a58-2f0c1c1f0e11"


def test_a_plain_dict_becomes_the_annotated_dataclass_with_its_fields_shaped():
    got = shaped(
        {"id": ID, "lines": [{"sku": "a", "price": "1.10"}], "placed": "2026-12-03T07:15:00+00:00"}, Order
    )
    assert got == Order(uuid.UUID(ID), [Line("a", Decimal("1.10"))], datetime(2026, 12, 3, 7, 15, tzinfo=UTC))


@pytest.mark.parametrize(
    ("value", "hint", "expected"),
    [
        ("12.34", Decimal, Decimal("12.34")),
        (3, Decimal, Decimal(3)),
        ("2026-12-03", date, date(2026, 12, 3)),
        (90, timedelta, timedelta(seconds=90)),
        ([1, 2, 3], timedelta, timedelta(days=1, seconds=2, microseconds=3)),
        (ID, uuid.UUID, uuid.UUID(ID)),
        ("AAH/", bytes, b"\x00\x01\xff"),
        ("red", Colour, Colour.RED),
        ({"x": 1, "y": "2.5"}, Point, Point(1, Decimal("2.5"))),
        ([1, "2.5"], Point, Point(1, Decimal("2.5"))),
        ({"name": "Ada", "since": "2020-01-02"}, Customer, Customer(name="Ada", since=date(2020, 1, 2))),
        (["1", "2"], list[Decimal], [Decimal(1), Decimal(2)]),
        (["1", "2"], tuple[Decimal, ...], (Decimal(1), Decimal(2))),
        ({"a": "1"}, dict[str, Decimal], {"a": Decimal(1)}),
        (None, Decimal | None, None),
        ("1", Decimal | None, Decimal(1)),
    ],
)
def test_plain_json_becomes_the_annotated_type(value, hint, expected):
    got = shaped(value, hint)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("not a number", Decimal),
        ({"unknown": 1}, Line),
        ({"name": "Ada"}, Customer),  # a field missing: pydantic refuses it
        ("green", Colour),
        (5, str),
        ({"a": 1}, None),
    ],
)
def test_a_value_the_annotation_does_not_describe_comes_back_as_it_is(value, hint):
    assert shaped(value, hint) is value


def test_a_value_of_the_annotated_type_is_not_rebuilt():
    line = Line("a", Decimal(1))
    assert shaped(line, Line) is line


def test_a_functions_signature_shapes_the_arguments_it_binds_and_names_its_result():
    def charge(order: Order, times: int = 1, *, discount: Decimal | None = None) -> Line:
        raise AssertionError("never called")

    sig = signature(charge)
    args, kwargs = sig.arguments(
        [{"id": ID, "lines": [], "placed": "2026-12-03T07:15:00+00:00"}, 2], {"discount": "0.5"}
    )
    assert isinstance(args[0], Order) and args[1] == 2
    assert kwargs == {"discount": Decimal("0.5")}
    assert sig.returns is Line
    assert sig.parameter(0) is Order and sig.parameter(5) is None


def test_arguments_that_do_not_bind_are_left_for_the_call_to_refuse():
    def one(x: Decimal) -> None:
        raise AssertionError("never called")

    assert signature(one).arguments(["1", "2"], {}) == (["1", "2"], {})


def test_positional_arguments_are_shaped_without_binding_and_left_alone_when_already_typed():
    def line(sku: str, price: Decimal, /, when: date) -> None:
        raise AssertionError("never called")

    def spread(first: Decimal, *rest: Decimal) -> None:
        raise AssertionError("never called")

    sig = signature(line)
    typed = ["a", Decimal("1.5"), date(2026, 12, 3)]
    assert sig.arguments(typed, {}) == (typed, {})
    assert sig.arguments(["a", "1.5"], {}) == (["a", Decimal("1.5")], {})
    assert sig.arguments(["a", "1.5"], {"when": "2026-12-03"}) == (
        ["a", Decimal("1.5")],
        {"when": date(2026, 12, 3)},
    )
    # Past a *args parameter, binding decides which annotation a value takes.
    assert signature(spread).positional is None
    assert signature(spread).arguments(["1", "2"], {}) == ([Decimal("1"), Decimal("2")], {})
