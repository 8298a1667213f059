"""The example app's workflows, through durable_env."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

ORDER = {
    "id": 7,
    "items": [{"sku": "mug", "cents": 1250, "qty": 2}, {"sku": "tea", "cents": 800, "qty": 1}],
    "cooling_off": "2s",
}


def test_fulfil_retries_the_charge_sleeps_and_waits_for_approval(durable_env):
    run = durable.start("shop.fulfil", ORDER)
    durable_env.run_until_idle()
    durable_env.advance_time("1s")  # the charge's retry backoff
    durable_env.advance_time("2s")  # the cooling-off timer
    assert Checkpoint.objects.filter(run_id=run.id, kind="signal", status="pending").exists()
    durable.signal(run.id, "approve", {"address": "1 Main St, Springfield"})
    durable_env.run_until_idle()
    output = durable.result(run.id)
    assert output["cents"] == 3300 and output["tracking"] == "TRACK-7-SPRINGFIELD"
    assert Checkpoint.objects.get(run_id=run.id, name="shop.charge_card").attempt == 2


def test_wholesale_fans_out_invoices_in_a_child_and_holds_stock(durable_env):
    run = durable.start("shop.wholesale", ORDER)
    durable_env.run_until_idle()
    durable_env.advance_time("1s")  # the child's charge retry
    output = durable.result(run.id)
    assert output == {
        "holds": ["hold-mug-2", "hold-tea-1"],
        "labels": ["LABEL-MUGx2", "LABEL-TEAx1"],
        "invoice": "INV-7",
    }
    assert Run.objects.filter(parent_id=run.id, workflow="shop.send_invoice", status="completed").count() == 1


def test_wholesale_releases_held_stock_when_it_fails(durable_env):
    bad = {"sku": "ghost", "cents": 1, "qty": 0}
    run = durable.start("shop.wholesale", {**ORDER, "items": [*ORDER["items"], bad]})
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert (record.status, record.error["code"]) == ("failed", "bad_quantity")
    undone = Checkpoint.objects.filter(run_id=run.id, kind="compensation", status="completed")
    assert undone.count() == 2


def test_hold_order_holds_every_item_or_none(durable_env):
    durable.signal_entity("shop.stock", "mug", "restock", 4)
    durable.signal_entity("shop.stock", "tea", "restock", 1)
    first = durable.start("shop.hold_order", ORDER)  # 2 mugs, 1 tea
    durable_env.run_until_idle()
    assert durable.result(first.id) == {"held": True}
    second = durable.start("shop.hold_order", ORDER)  # 2 mugs held, but no tea: the mugs go back
    durable_env.run_until_idle()
    assert durable.result(second.id) == {"held": False, "reason": "only 0 tea left"}
    assert durable.entity_state("shop.stock", "mug") == {"on_hand": 4, "held": 2}
    assert durable.entity_state("shop.stock", "tea") == {"on_hand": 1, "held": 1}
