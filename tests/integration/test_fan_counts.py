"""Each fan counts its open members (``durable.models.Fan``), so the member that
settles last knows it without reading the others; the count must follow every way a member
settles, or keep no count at all. A count too high would leave the run waiting for its
safety-net wake; too low, a turn that finds members pending and waits again."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint, Fan

pytestmark = pytest.mark.django_db(transaction=True)

failing = {"item": 1}


@durable.step(name="tests.fan_counts.item")
def item(i):
    if i == failing["item"]:
        raise durable.ApplicationError(f"{i} is bad", code="bad_item", non_retryable=True)
    return i


@durable.workflow(name="tests.fan_counts.settled")
def settled(ctx, n):
    return [o.ok for o in ctx.all_settled([ctx.defer(item, i) for i in range(n)])]


@durable.workflow(name="tests.fan_counts.fail_fast")
def fail_fast(ctx, n):
    return ctx.all([ctx.defer(item, i) for i in range(n)])


@durable.workflow(name="tests.fan_counts.leaf")
def leaf(ctx, i):
    return ctx.step(item, i)


@durable.workflow(name="tests.fan_counts.children")
def children(ctx, n):
    return ctx.all([ctx.defer_child(leaf, i) for i in range(n)])


def counted(run_id: str) -> int | None:
    """The count the run's one fan keeps, None if it keeps none."""
    fan = Fan.objects.filter(run_id=run_id).first()
    return None if fan is None else fan.pending


def pending(run_id: str) -> int:
    return Checkpoint.objects.filter(run_id=run_id, status="pending").exclude(fan=None).count()


@pytest.fixture(autouse=True)
def _failing_item():
    failing["item"] = 1
    yield
    failing["item"] = 1


def test_a_new_fan_counts_its_members_and_each_result_counts_one_out(durable_env):
    run = durable.start(settled, 5)
    durable_env.run_next()  # the turn that positions the fan
    assert counted(run.id) == 5
    durable_env.run_next()  # one member's attempt
    assert counted(run.id) == pending(run.id) == 4
    durable_env.run_until_idle()
    assert durable.result(run.id) == [True, False, True, True, True]
    assert counted(run.id) == 0


def test_members_settling_after_a_fail_fast_failure_are_counted_out_too(durable_env):
    run = durable.start(fail_fast, 4)
    durable_env.run_until_idle()
    with pytest.raises(durable.DurableError):
        durable.result(run.id)
    assert counted(run.id) == pending(run.id)


def test_children_in_a_fan_are_counted_out_as_they_end(durable_env):
    failing["item"] = -1
    run = durable.start(children, 3)
    durable_env.run_next()
    assert counted(run.id) == 3
    durable_env.run_until_idle()
    assert durable.result(run.id) == [0, 1, 2]
    assert counted(run.id) == 0


def test_a_retried_run_keeps_no_count_for_the_fan_it_positions_again(durable_env):
    run = durable.start(fail_fast, 3)
    durable_env.run_until_idle()
    with pytest.raises(durable.DurableError):
        durable.result(run.id)
    failing["item"] = -1
    durable.retry(run.id)
    assert counted(run.id) is None  # members are asked from here on
    durable_env.run_until_idle()
    # Members whose messages the failed run refused are sent again by the orphan sweep.
    durable_env.advance_time("1h")
    assert durable.result(run.id) == [0, 1, 2]
    assert counted(run.id) is None
