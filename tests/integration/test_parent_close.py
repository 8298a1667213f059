"""Children and deadlines: what an unfinished child becomes when its parent ends, however it ends
(``on_parent_close``: "cancel", the default, "interrupt" or "abandon"), and a parent's deadline
that is its children's too."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

CLEANED: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    CLEANED.clear()


@durable.step(name="tests.parent_close.tidy")
def tidy(name: str) -> str:
    CLEANED.append(name)
    return name


@durable.workflow(name="tests.parent_close.waiter")
def waiter(ctx, name):
    try:
        return ctx.wait_for_signal("go")
    finally:
        ctx.step(tidy, name)


@durable.workflow(name="tests.parent_close.slow_child", timeout="1d")
def slow_child(ctx, _):
    ctx.sleep("2d")
    return "woke"


@durable.workflow(name="tests.parent_close.parent")
def parent(ctx, spec):
    ids = [ctx.start_child(waiter, name, on_parent_close=policy) for name, policy in spec["children"]]
    if spec.get("fail"):
        raise durable.ApplicationError("the parent gives up", code="gave_up", non_retryable=True)
    if spec.get("wait"):
        ctx.wait_for_signal("never")
    return ids


@durable.workflow(name="tests.parent_close.remote_parent", remote=True, queue="pc-remote-turns")
def remote_parent(ctx, _):
    child_id = ctx.start_child(waiter, "far")  # in the first turn
    ctx.wait_for_signal("done")
    return child_id  # in a later turn, whose decision carries only what it changed


@durable.workflow(name="tests.parent_close.unbounded")
def unbounded(ctx, _):
    return ctx.child(slow_child, None)


@durable.workflow(name="tests.parent_close.bounded", timeout="1h")
def bounded(ctx, _):
    return ctx.child(slow_child, None)


@durable.workflow(name="tests.parent_close.bad")
def bad(ctx, _):
    return ctx.start_child(waiter, "x", on_parent_close="terminate")


def statuses(ids):
    return [Run.objects.get(id=i).status for i in ids]


def test_a_parent_that_completes_cancels_its_unfinished_children_by_default(durable_env):
    run = durable.start(parent, {"children": [["a", "cancel"], ["b", "cancel"]]})
    durable_env.run_until_idle()
    ids = durable.result(run.id)
    assert statuses(ids) == ["cancelled", "cancelled"]
    error = Run.objects.get(id=ids[0]).error
    assert (error["code"], error["message"]) == ("cancelled", f"its parent {run.id} ended completed")
    assert CLEANED == []  # cancelled outright: no turn ran the body's finally


def test_an_abandoned_child_runs_on_after_its_parent_completed(durable_env):
    run = durable.start(parent, {"children": [["kept", "abandon"], ["gone", "cancel"]]})
    durable_env.run_until_idle()
    kept, gone = durable.result(run.id)
    assert statuses([kept, gone]) == ["suspended", "cancelled"]
    durable.signal(kept, "go", "still here")
    durable_env.run_until_idle()
    assert durable.result(kept) == "still here" and CLEANED == ["kept"]


def test_an_interrupted_child_cleans_up_in_finally_then_ends_cancelled(durable_env):
    run = durable.start(parent, {"children": [["c", "interrupt"]], "fail": True})
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "failed"
    child = Run.objects.get(parent_id=run.id)
    assert child.status == "cancelled" and CLEANED == ["c"]
    assert f"its parent {run.id} ended failed" in child.error["message"]


def test_a_cancelled_parent_cancels_its_children_depth_first_but_not_an_abandoned_one(durable_env):
    run = durable.start(parent, {"children": [["a", "cancel"], ["b", "abandon"]], "wait": True})
    durable_env.run_until_idle()
    durable.cancel(run.id)
    durable_env.run_until_idle()
    a, b = Run.objects.filter(parent_id=run.id).order_by("parent_seq")
    assert (a.status, b.status) == ("cancelled", "suspended")
    assert a.error["message"].endswith(f"(its parent {run.id} was cancelled)")


def test_a_parents_deadline_is_its_childs_and_ends_both(durable_env):
    run = durable.start(bounded)
    durable_env.run_until_idle()
    child = Run.objects.get(parent_id=run.id)
    parent_row = Run.objects.get(id=run.id)
    # The child's own timeout (1 day) comes after its parent's (1 hour): the parent's holds.
    assert child.deadline == parent_row.deadline
    durable_env.advance_time(timedelta(hours=1, seconds=1))
    assert durable.get_run(run.id).status == "failed"
    assert durable.get_run(run.id).error["code"] == "timeout"
    assert Run.objects.get(id=child.id).status in ("failed", "cancelled")


def test_a_child_keeps_its_own_timeout_when_its_parent_has_none(durable_env):
    run = durable.start(unbounded)
    durable_env.run_until_idle()
    child = Run.objects.get(parent_id=run.id)
    assert Run.objects.get(id=run.id).deadline is None
    assert child.deadline == child.created_at + timedelta(days=1)


def test_a_parent_whose_turns_run_remotely_closes_children_an_earlier_turn_started(durable_env):
    run = durable.start(remote_parent)
    durable_env.run_until_idle()
    durable.signal(run.id, "done")
    durable_env.run_until_idle()
    child_id = durable.result(run.id)
    assert Run.objects.get(id=child_id).status == "cancelled"


def test_a_policy_durable_does_not_know_fails_the_body_saying_which_it_takes(durable_env):
    run = durable.start(bad)
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert "on_parent_close takes one of ('cancel', 'interrupt', 'abandon')" in record.error["message"]
    assert not Run.objects.filter(parent_id=run.id).exists()


def test_the_policy_is_kept_in_the_parents_history_only_when_it_is_not_the_default(durable_env):
    run = durable.start(parent, {"children": [["a", "cancel"], ["b", "interrupt"]]})
    durable_env.run_until_idle()
    inputs = list(
        Checkpoint.objects.filter(run_id=run.id, kind="child").order_by("seq").values_list("input", flat=True)
    )
    assert "on_parent_close" not in inputs[0] and inputs[1]["on_parent_close"] == "interrupt"
    assert list(
        Run.objects.filter(parent_id=run.id).order_by("parent_seq").values_list("on_parent_close", flat=True)
    ) == [
        None,
        "interrupt",
    ]
