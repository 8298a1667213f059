"""Annotations decide what the step, the body and the caller of ``durable.result`` receive, also
when the value was stored untagged (a remote worker's plain JSON, a caller's dict, a row written
before the annotation): on the first turn as on every replay (API.md §10, Values)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

import durable

pytestmark = pytest.mark.django_db

seen: list[object] = []


@dataclasses.dataclass(frozen=True)
class Order:
    sku: str
    amount: Decimal


@dataclasses.dataclass(frozen=True)
class Receipt:
    order: Order
    total: Decimal


@durable.step(name="tests.annotated.charge", timeout="10s")
def charge(order: Order) -> Receipt:
    seen.append(("step got", order))
    # As a worker that knows nothing of the classes answers: plain JSON.
    return {"order": {"sku": order.sku, "amount": str(order.amount)}, "total": str(order.amount * 2)}


@durable.step(name="tests.annotated.charge_in_place")
def charge_in_place(order: Order) -> Receipt:
    return {"order": {"sku": order.sku, "amount": str(order.amount)}, "total": str(order.amount * 3)}


@durable.workflow(name="tests.annotated.checkout")
def checkout(ctx, order: Order) -> Receipt:
    seen.append(("body got", order))
    receipt = ctx.step(charge, {"sku": order.sku, "amount": str(order.amount)})
    seen.append(("body got back", receipt))
    in_place = ctx.step(charge_in_place, order)
    seen.append(("body got back in place", in_place))
    ctx.sleep("1m")
    return {"order": {"sku": "x", "amount": "1"}, "total": str(receipt.total + in_place.total)}


@pytest.fixture(autouse=True)
def _clear():
    seen.clear()


def test_plain_json_comes_back_as_the_annotated_classes_everywhere(durable_env):
    run = durable.start(checkout, {"sku": "book", "amount": "10.00"})
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    order = Order("book", Decimal("10.00"))
    # Every turn, replays included, saw the same typed values.
    kinds = {label: {type(value) for got, value in seen if got == label} for label, _ in seen}
    assert kinds == {
        "body got": {Order},
        "step got": {Order},
        "body got back": {Receipt},
        "body got back in place": {Receipt},
    }
    assert ("step got", order) in seen
    assert ("body got back", Receipt(order, Decimal("20.00"))) in seen
    assert ("body got back in place", Receipt(order, Decimal("30.00"))) in seen
    assert len([got for got, _ in seen if got == "body got"]) >= 2  # a replay happened
    assert durable.result(run.id) == Receipt(Order("x", Decimal(1)), Decimal("50.00"))


def test_a_value_the_annotation_does_not_describe_reaches_the_body_as_it_is(durable_env):
    run = durable.start(checkout, ["not", "an", "order"])
    durable_env.run_until_idle()
    assert ("body got", ["not", "an", "order"]) in seen
    assert durable.get_run(run.id).status == "failed"  # the body's own code failed on it
