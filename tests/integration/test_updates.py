"""``durable.signal_with_start`` and ``durable.update`` with its validators."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

import durable
from durable.models import Run, Signal

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.updates_cart")
def cart(ctx, owner):
    items = []
    while True:
        change = ctx.wait_for_signal("cart")
        if change == "checkout":
            return {"owner": owner, "items": items}
        items.append(change)


@cart.validator("cart")
def _no_empty_items(payload):
    if payload in ("", None):
        raise ValueError("an empty item cannot go in the cart")


@durable.workflow(name="tests.updates_plain")
def plain(ctx, _):
    return ctx.wait_for_signal("note")


def test_signal_with_start_starts_an_absent_run_and_signals_it(durable_env):
    handle = durable.signal_with_start(cart, "ann", run_id="cart-ann", signal="cart", payload="tea")
    assert handle.id == "cart-ann"
    durable.signal("cart-ann", "cart", "checkout")
    durable_env.run_until_idle()
    assert durable.result("cart-ann") == {"owner": "ann", "items": ["tea"]}


def test_signal_with_start_signals_an_existing_run_and_ignores_the_input(durable_env):
    durable.start(cart, "ann", run_id="cart-ann")
    durable_env.run_until_idle()
    durable.signal_with_start(cart, "bob", run_id="cart-ann", signal="cart", payload="mug")
    durable.signal_with_start(
        "tests.updates_cart", "carl", run_id="cart-ann", signal="cart", payload="checkout"
    )
    durable_env.run_until_idle()
    assert Run.objects.count() == 1
    assert durable.result("cart-ann") == {"owner": "ann", "items": ["mug"]}


def test_signal_with_start_of_a_finished_run_stores_nothing(durable_env):
    durable.signal_with_start(cart, "ann", run_id="cart-ann", signal="cart", payload="checkout")
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFinished):
        durable.signal_with_start(cart, "ann", run_id="cart-ann", signal="cart", payload="tea")
    assert Signal.objects.filter(payload="tea").count() == 0


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"run_id": "x", "signal": "", "payload": 1}, "non-empty name"),
        ({"run_id": "x", "signal": "cart", "payload": object()}, "JSON"),
        ({"run_id": None, "signal": "cart"}, "run_id"),
        ({"run_id": "x", "signal": "cart", "payload": 1, "input_": {"ids": object()}}, "JSON"),
    ],
)
def test_signal_with_start_refuses_bad_input_before_storing_anything(durable_env, kwargs, says):
    input_ = kwargs.pop("input_", "ann")
    with pytest.raises(durable.InvalidInput, match=says):
        durable.signal_with_start(cart, input_, **kwargs)
    assert not Run.objects.exists() and not Signal.objects.exists()


def test_update_accepted_by_its_validator_is_delivered_as_a_signal(durable_env):
    durable.start(cart, "ann", run_id="cart-ann")
    durable.update("cart-ann", "cart", "tea")
    durable.update("cart-ann", "cart", "checkout")
    durable_env.run_until_idle()
    assert durable.result("cart-ann") == {"owner": "ann", "items": ["tea"]}


def test_update_refused_by_its_validator_stores_nothing(durable_env):
    durable.start(cart, "ann", run_id="cart-ann")
    durable_env.run_until_idle()
    with pytest.raises(durable.UpdateRejected, match="an empty item cannot go in the cart") as caught:
        durable.update("cart-ann", "cart", "")
    assert caught.value.code == "update_rejected"
    assert caught.value.details["type"] == "ValueError"
    assert not Signal.objects.exists()
    assert durable.get_run("cart-ann").status == "suspended"


def test_update_without_a_validator_is_a_signal(durable_env):
    run = durable.start(plain)
    durable.update(run.id, "note", {"text": "hi"})
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"text": "hi"}


def test_update_of_an_unknown_or_finished_run_is_refused(durable_env):
    with pytest.raises(durable.RunNotFound):
        durable.update("nope", "cart", "tea")
    run = durable.start(plain)
    durable.signal(run.id, "note", 1)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFinished):
        durable.update(run.id, "note", 2)
    assert Signal.objects.count() == 1


def test_a_validator_needs_an_update_name_and_a_function():
    with pytest.raises(durable.InvalidInput, match="update's name"):
        cart.validator("")
    with pytest.raises(durable.InvalidInput, match="decorates a function"):
        cart.validator("cart")("not a function")


def test_concurrent_signal_with_start_makes_one_run_and_keeps_both_signals(
    postgres, transactional_db, durable_env
):
    first_wrote = threading.Event()
    errors: list[BaseException] = []

    def call(payload, hold):
        try:
            with transaction.atomic():
                durable.signal_with_start(cart, "ann", run_id="cart-race", signal="cart", payload=payload)
                first_wrote.set()
                if hold:
                    time.sleep(0.5)  # the second caller's INSERT waits on this uncommitted row
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    first = threading.Thread(target=call, args=("tea", True))
    first.start()
    first_wrote.wait(10)
    second = threading.Thread(target=call, args=("mug", False))
    second.start()
    first.join(10)
    second.join(10)
    assert errors == []
    assert list(Run.objects.values_list("id", flat=True)) == ["cart-race"]
    assert sorted(Signal.objects.values_list("payload", flat=True)) == ["mug", "tea"]
