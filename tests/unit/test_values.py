"""The value converter: standard types round-trip through tagged JSON, plain JSON is untouched,
and a value with no JSON form is refused naming where it sits and what to pass instead."""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import re
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import NamedTuple

import pytest

from durable.errors import InvalidInput
from durable.values import (
    TAG,
    accept_naive_datetimes,
    decode,
    encode,
    register_annotations,
    register_converter,
    register_type,
)


def through_a_row(value):
    """What a body reads back once ``value`` was stored as JSON and loaded again."""
    return decode(json.loads(json.dumps(encode(value, what="the value"))))


STANDARD = [
    datetime(2026, 12, 3, 7, 15, 30, 123456, tzinfo=UTC),
    datetime(2026, 12, 3, 7, 15, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    date(2026, 2, 28),
    time(23, 59, 59, 999999),
    timedelta(days=-3, seconds=5, microseconds=7),
    Decimal("12.34"),
    Decimal("0.10"),  # the exponent is kept: 0.10 is not written back as 0.1
    Decimal("-1E+30"),
    uuid.UUID("0190c3a8-59b4-7c4e-9a58-2f0c1c1f0e11"),
    b"\x00\xffbytes",
    b"",
    (1, "two", 3.0),
    (),
    {1, 2, 3},
    frozenset({"a", "b"}),
]


@pytest.mark.parametrize("value", STANDARD, ids=lambda v: type(v).__name__)
def test_each_standard_type_comes_back_as_the_same_type_with_an_equal_value(value):
    back = through_a_row(value)
    assert type(back) is type(value)
    assert back == value
    if isinstance(value, Decimal):
        assert str(back) == str(value)
    if isinstance(value, datetime):
        assert back.utcoffset() == value.utcoffset()


def test_a_tagged_value_is_still_json_a_row_can_query():
    assert encode(Decimal("12.34"), what="x") == {TAG: "decimal", "v": "12.34"}
    assert encode({"due": date(2026, 1, 2)}, what="x") == {"due": {TAG: "date", "v": "2026-01-02"}}


def test_nested_values_come_back_typed_at_every_depth():
    order = {
        "id": uuid.uuid4(),
        "items": [{"price": Decimal("9.99"), "sku": "A"}, {"price": Decimal("0.01"), "tags": {"x"}}],
        "placed": datetime(2026, 1, 1, tzinfo=UTC),
        "window": (date(2026, 1, 1), date(2026, 1, 31)),
        "plain": [1, "two", None, True, 2.5],
    }
    assert through_a_row(order) == order


def test_plain_json_encodes_and_decodes_to_the_very_same_object():
    plain = {"user": 5, "names": ["a", "b"], "nested": {"ok": True, "n": None, "f": 1.5}}
    assert encode(plain, what="x") is plain
    assert decode(plain) is plain


@pytest.mark.parametrize(
    "old",
    [
        None,
        "text",
        3,
        [1, [2, {"a": "b"}]],
        {"__durable__": "not a tag we know", "v": 1},
        {"__durable__": "decimal", "v": "1", "other": 2},
    ],
)
def test_json_stored_before_tags_existed_reads_back_unchanged(old):
    assert decode(json.loads(json.dumps(old))) == old


def test_a_user_dict_holding_the_tag_key_is_escaped_and_comes_back_as_written():
    tricky = {TAG: "decimal", "v": "12.34"}
    stored = encode(tricky, what="x")
    assert stored == {TAG: "dict", "v": tricky}
    assert through_a_row(tricky) == tricky
    assert through_a_row({"outer": [tricky]}) == {"outer": [tricky]}


def test_a_set_is_written_the_same_way_whatever_its_iteration_order():
    one, other = {"pear", "apple", "fig", "kiwi"}, {"kiwi", "fig", "apple", "pear"}
    assert json.dumps(encode(one, what="x")) == json.dumps(encode(other, what="x"))


def test_str_and_int_enum_members_stay_their_plain_value_as_before():
    class Colour(enum.StrEnum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    assert encode({"c": Colour.RED, "l": Level.HIGH}, what="x") == {"c": "red", "l": 3}


def test_scalar_dict_keys_become_strings_as_json_made_them():
    assert through_a_row({1: "a", None: "b"}) == {"1": "a", "null": "b"}


class _Model:
    """Stands for a Django model instance: a class with ``_meta`` and a ``pk``."""

    _meta = object()
    pk = 42


@dataclasses.dataclass
class Price:
    amount: int


class Point(NamedTuple):
    x: int


class Plain(enum.Enum):
    A = 1


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (float("nan"), "the float nan, which JSON cannot hold; pass None or a Decimal"),
        (float("inf"), "the float inf"),
        (Decimal("NaN"), "pass a finite Decimal"),
        (_Model(), "is a Django model instance (_Model); pass its pk (42)"),
        (lambda: 1, "is a function"),
        (len, "is a function"),
        (io.BytesIO(b"x"), "is a file (BytesIO); pass its path, or its content as bytes"),
        (
            Price(1),
            "is a dataclass (Price); pass dataclasses.asdict() of it, or call durable.register_type(Price)",
        ),
        (Point(1), "is a named tuple (Point)"),
        (Plain.A, "is the enum member <Plain.A: 1>; pass its .value, or call durable.register_type(Plain)"),
        (object(), "is an instance of object, which has no JSON form"),
        (bytearray(b"x"), "is an instance of bytearray"),
    ],
)
def test_a_value_with_no_json_form_is_refused_naming_its_path_and_what_to_pass(value, says):
    order = {"items": [{"price": 1}, {"price": 2}, {"price": value}]}
    with pytest.raises(InvalidInput) as refused:
        encode({"order": order}, what="the input of workflow 'shop'")
    assert refused.value.message.startswith("the input of workflow 'shop' at order.items[2].price ")
    assert says in refused.value.message
    assert refused.value.details == {"field": "the input of workflow 'shop'", "path": "order.items[2].price"}


def test_a_refused_top_level_value_is_named_by_what_alone():
    with pytest.raises(InvalidInput, match=r"^the output of step 's' is a function"):
        encode(lambda: 1, what="the output of step 's'")


def test_a_key_that_is_not_an_identifier_is_shown_quoted_in_the_path():
    with pytest.raises(InvalidInput, match=r"at rows\['a key'\]\[0\] is the float nan"):
        encode({"rows": {"a key": [float("nan")]}}, what="x")


def test_a_naive_datetime_is_refused_unless_use_tz_is_off():
    naive = datetime(2026, 1, 1, 12, 0)
    with pytest.raises(InvalidInput, match=r"at when is a naive datetime .* pass an aware one"):
        encode({"when": naive}, what="x")
    accept_naive_datetimes(True)
    try:
        assert through_a_row(naive) == naive
    finally:
        accept_naive_datetimes(False)


def test_a_datetime_subclass_such_as_freezeguns_is_written_as_a_datetime():
    class Frozen(datetime):
        pass

    back = through_a_row(Frozen(2026, 1, 1, tzinfo=UTC))
    assert type(back) is datetime and back == datetime(2026, 1, 1, tzinfo=UTC)


# -- registered types ----------------------------------------------------------------------


class Status(enum.Enum):
    OPEN = "open"
    PAID = "paid"


class Priority(enum.IntEnum):
    LOW = 1


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal


@dataclasses.dataclass(frozen=True)
class Receipt:
    number: uuid.UUID
    lines: tuple[Line, ...]
    status: Status


class Span(NamedTuple):
    start: date
    end: date


class Money:
    def __init__(self, cents: int, currency: str) -> None:
        self.cents, self.currency = cents, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (other.cents, other.currency) == (self.cents, self.currency)


register_type(Status)
register_type(Priority)
register_type(Line)
register_type(Receipt)
register_type(Span)
register_converter(Money, lambda m: [m.cents, m.currency], lambda v: Money(*v), name="tests.money")


@pytest.mark.parametrize(
    "value",
    [
        Status.PAID,
        Priority.LOW,
        Span(date(2026, 1, 1), date(2026, 1, 31)),
        Receipt(uuid.uuid4(), (Line("A", Decimal("1.10")), Line("B", Decimal("2"))), Status.OPEN),
        Money(1234, "EUR"),
        {"nested": [Money(1, "USD"), Status.OPEN]},
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_registered_type_comes_back_as_itself_nested_types_included(value):
    back = through_a_row(value)
    assert type(back) is type(value)
    assert back == value


def test_a_registered_type_is_stored_under_its_name_as_queryable_json():
    assert encode(Money(5, "EUR"), what="x") == {TAG: "tests.money", "v": [5, "EUR"]}
    assert encode(Line("A", Decimal("1")), what="x") == {
        TAG: "tests.unit.test_values.Line",
        "v": {"sku": "A", "price": {TAG: "decimal", "v": "1"}},
    }


def test_a_tag_of_a_type_this_process_did_not_register_reads_back_as_the_stored_dict():
    stored = {TAG: "somewhere.else.Unknown", "v": {"a": 1}}
    assert decode(stored) == stored


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: register_type(Money), "register_type() takes an Enum, a dataclass"),
        (lambda: register_converter(Decimal, str, Decimal), "durable converts Decimal already"),
        (lambda: register_converter(Money, str, str, name="decimal"), "cannot use the name 'decimal'"),
        (lambda: register_converter(Point, str, str, name="tests.money"), "another type is registered"),
        (lambda: register_converter("Money", str, str), "needs a class"),
        (lambda: register_converter(Point, str, 3), "needs two functions"),
    ],
)
def test_a_bad_registration_is_refused_saying_what_to_fix(call, says):
    with pytest.raises(InvalidInput, match=re.escape(says)):
        call()


def test_a_value_that_holds_itself_is_refused_not_walked_forever():
    loop: list = [Decimal("1")]
    loop.append(loop)
    with pytest.raises(
        InvalidInput, match=r"^x is nested deeper than 100 levels of lists and dicts \(or holds itself\)"
    ):
        encode(loop, what="x")
    plain_loop: dict = {}
    plain_loop["me"] = plain_loop
    with pytest.raises(InvalidInput, match="holds itself"):
        encode(plain_loop, what="x")


def test_a_typed_value_nested_past_the_limit_is_refused_naming_the_limit():
    deep: object = Decimal("1")
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidInput, match=r"^x is nested deeper than 100 levels"):
        encode(deep, what="x")


def test_a_registered_pydantic_model_comes_back_as_itself_with_its_field_types():
    pydantic = pytest.importorskip("pydantic")

    class Invoice(pydantic.BaseModel):
        total: Decimal
        due: date

    register_type(Invoice, name="tests.invoice")
    invoice = Invoice(total=Decimal("10.50"), due=date(2026, 1, 31))
    assert encode(invoice, what="x") == {TAG: "tests.invoice", "v": {"total": "10.50", "due": "2026-01-31"}}
    back = through_a_row({"invoice": invoice})["invoice"]
    assert type(back) is Invoice and back == invoice


# -- classes named by annotations --------------------------------------------------------------


class Colour(enum.Enum):
    RED = "red"


class Size(enum.StrEnum):
    BIG = "big"


@dataclasses.dataclass(frozen=True)
class Item:
    colour: Colour
    size: Size


@dataclasses.dataclass(frozen=True)
class Basket:
    items: list[Item]


class Slot(NamedTuple):
    at: datetime


def pack(basket: Basket, slot: Slot | None = None) -> dict[str, Basket]:
    return {"basket": basket}


def test_the_classes_a_functions_annotations_name_are_registered_fields_included():
    register_annotations(pack)
    basket = Basket([Item(Colour.RED, Size.BIG)])
    assert through_a_row({"basket": basket, "slot": Slot(datetime(2026, 1, 1, tzinfo=UTC))}) == {
        "basket": basket,
        "slot": Slot(datetime(2026, 1, 1, tzinfo=UTC)),
    }
    # A str Enum keeps its plain, queryable form.
    assert encode(Item(Colour.RED, Size.BIG), what="x")["v"]["size"] == "big"


def test_an_annotation_that_cannot_be_resolved_or_whose_name_is_taken_is_left_alone():
    def unresolved(order: NotDefinedAnywhere) -> None:  # noqa: F821
        pass

    register_annotations(unresolved)

    def make():
        @dataclasses.dataclass
        class Again:
            n: int

        def uses(a):
            pass

        uses.__annotations__ = {"a": Again}  # resolved, as a module-level class's would be
        return Again, uses

    first, uses_first = make()
    second, uses_second = make()
    register_annotations(uses_first)
    register_annotations(uses_second)  # the same name, another class: not registered, no error
    assert type(through_a_row(first(1))) is first
    with pytest.raises(InvalidInput, match="register_type"):
        encode(second(1), what="x")
