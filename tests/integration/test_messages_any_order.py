"""``ctx.wait_for_message`` through durable_env: signals and updates of several names handled in
whatever order callers send them, each update's reply reaching its own caller, typed payloads
kept on the first turn as on replays."""

from __future__ import annotations

from decimal import Decimal

import pytest

import durable
from durable.engine import updates
from durable.models import Checkpoint, Signal
from durable.values import decode

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.any_order_basket")
def basket(ctx, owner):
    items: dict[str, Decimal] = {}
    while True:
        message = ctx.wait_for_message(signals=["checkout", "note"], updates=["add", "remove"])
        if isinstance(message, durable.Signal):
            if message.name == "checkout":
                return {"owner": owner, "total": sum(items.values(), Decimal(0)), "paid": message.payload}
            ctx.expose("note", message.payload)
            continue
        if message.name == "add":
            name, price = message.payload
            items[name] = price
        else:
            items.pop(message.payload, None)
        ctx.reply(message, {"count": len(items), "total": sum(items.values(), Decimal(0))})


@basket.validator("add")
def _priced(payload):
    name, price = payload
    if not isinstance(price, Decimal) or price <= 0:
        raise ValueError("an item is (name, a positive Decimal price)")


def test_updates_and_signals_sent_in_any_order_are_handled_in_that_order(durable_env):
    run = durable.start(basket, "ann")
    tea = durable.update(run.id, "add", ("tea", Decimal("3.20")))
    durable.signal(run.id, "note", "leave at the door")
    jam = durable.update(run.id, "add", ("jam", Decimal("4.05")))
    gone = durable.update(run.id, "remove", "tea")
    durable_env.run_until_idle()
    assert durable.query(run.id, "note") == "leave at the door"
    assert durable.update(run.id, "add", ("tea", Decimal("3.20")), idempotency_key="x") is not None
    durable.signal(run.id, "checkout", Decimal("7.25"))
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"owner": "ann", "total": Decimal("7.25"), "paid": Decimal("7.25")}
    rows = Signal.objects.filter(run_id=run.id, is_update=True).values_list("id", "reply")
    replies = {update_id: decode(reply) for update_id, reply in rows}
    assert durable.update(run.id, "add", ("x", Decimal(1)), idempotency_key="x", wait="1s") == {
        "count": 2,
        "total": Decimal("7.25"),
    }
    assert [replies[tea], replies[jam], replies[gone]] == [
        {"count": 1, "total": Decimal("3.20")},
        {"count": 2, "total": Decimal("7.25")},
        {"count": 1, "total": Decimal("4.05")},
    ]
    kinds = list(Checkpoint.objects.filter(run_id=run.id).order_by("seq").values_list("kind", flat=True))
    assert kinds.count("message") == 6 and kinds.count("reply") == 4


def test_an_update_taken_by_a_wait_for_a_message_is_answered_as_an_update(durable_env):
    run = durable.start(basket, "bob")
    update_id = durable.update(run.id, "add", ("pear", Decimal("1.10")))
    durable_env.run_until_idle()
    answer = updates.answer(update_id)
    assert (answer.replied, answer.taken_as_signal) == (True, False)
    durable.update(run.id, "remove", "pear", idempotency_key="pear")
    durable_env.run_until_idle()
    reply = durable.update(run.id, "remove", "pear", idempotency_key="pear", wait="1s")
    assert reply == {"count": 0, "total": Decimal(0)}


def test_a_signal_under_an_update_name_waits_until_the_validator_vetted_one_arrives(durable_env):
    run = durable.start(basket, "cy")
    durable.signal(run.id, "add", ("free", Decimal("0")))  # a plain signal skips the validator
    durable_env.run_until_idle()
    assert Signal.objects.get(run_id=run.id).consumed_seq is None
    assert durable.get_run(run.id).status == "suspended"
    with pytest.raises(durable.UpdateRejected):
        durable.update(run.id, "add", ("free", Decimal("0")))
