"""``ctx.expose`` and ``durable.query`` through durable_env."""

from __future__ import annotations

import pytest

import durable
from durable.engine import runs
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db


@durable.step
def pack(order):
    return f"parcel-{order}"


@durable.workflow(name="tests.queries_order")
def order_flow(ctx, order):
    ctx.expose("phase", "packing")
    parcel = ctx.step(pack, order)
    ctx.expose("phase", "waiting for pickup")
    ctx.expose("parcel", parcel)
    ctx.wait_for_signal("picked up")
    ctx.expose("phase", "shipped")
    return parcel


@durable.workflow(name="tests.queries_rounds")
def rounds(ctx, n):
    ctx.expose(f"round {n}", n)
    if n < 3:
        ctx.wait_for_signal("next")
        ctx.continue_as_new(n + 1)
    ctx.expose("last", True)
    return n


def test_query_reads_the_latest_value_a_running_run_exposed(durable_env):
    run = durable.start(order_flow, 7)
    durable_env.run_next()  # the first turn: exposes "packing", sends the step
    assert durable.query(run.id, "phase") == "packing"
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    assert durable.query(run.id, "phase") == "waiting for pickup"
    assert durable.query(run.id) == {"phase": "waiting for pickup", "parcel": "parcel-7"}


def test_replays_neither_undo_nor_repeat_what_was_exposed(durable_env):
    run = durable.start(order_flow, 7)
    durable_env.run_until_idle()
    durable.signal(run.id, "picked up")
    durable_env.run_until_idle()  # this turn replays the "packing" and "waiting" exposes
    assert durable.result(run.id) == "parcel-7"
    assert durable.query(run.id, "phase") == "shipped"
    assert Checkpoint.objects.filter(run_id=run.id, kind="expose").count() == 4


def test_a_finished_run_still_answers(durable_env):
    run = durable.start(order_flow, 7)
    durable_env.run_until_idle()
    durable.signal(run.id, "picked up")
    durable_env.run_until_idle()
    assert durable.query(run.id, "parcel", timeout="1s") == "parcel-7"


def test_a_name_not_exposed_reads_as_none_without_a_timeout(durable_env):
    run = durable.start(order_flow, 7)
    assert durable.query(run.id) == {}
    assert durable.query(run.id, "phase") is None


def test_a_query_with_a_timeout_under_durable_env_raises_wait_timeout_naming_the_state(durable_env):
    run = durable.start(order_flow, 7)
    with pytest.raises(durable.WaitTimeout, match="has not exposed 'phase'; it is pending") as caught:
        durable.query(run.id, "phase", timeout="5s")
    assert caught.value.details == {"status": "pending"}
    with pytest.raises(durable.WaitTimeout, match="has not exposed anything"):
        durable.query(run.id, timeout="5s")


def test_waiting_for_a_value_a_finished_run_never_exposed_raises_run_finished(durable_env):
    run = durable.start(order_flow, 7)
    durable_env.run_until_idle()
    durable.signal(run.id, "picked up")
    durable_env.run_until_idle()
    assert durable.query(run.id, "refund") is None
    with pytest.raises(durable.RunFinished, match="without exposing 'refund'"):
        durable.query(run.id, "refund", timeout="5s")


def test_query_follows_a_continue_as_new_chain_which_keeps_the_values(durable_env):
    run = durable.start(rounds, 1)
    for _ in range(2):
        durable_env.run_until_idle()
        assert durable.query(run.id, "last") is None
        durable.signal(runs.follow(run.id).id, "next")
    durable_env.run_until_idle()
    assert durable.query(run.id) == {"round 1": 1, "round 2": 2, "round 3": 3, "last": True}


def test_query_of_an_unknown_run_raises_run_not_found(durable_env):
    with pytest.raises(durable.RunNotFound):
        durable.query("nope", "phase")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [({"name": ""}, "name"), ({"name": 3}, "name"), ({"timeout": "later"}, "timeout")],
)
def test_query_refuses_bad_input(durable_env, kwargs, says):
    run = durable.start(order_flow, 7)
    with pytest.raises(durable.InvalidInput, match=says):
        durable.query(run.id, **kwargs)
