"""Every crash point of each scenario, one kill per run, and the invariants checked after each
(see tests/crashpoints.py and docs/guarantees.md, "Checked at every crash point")."""

from __future__ import annotations

import pytest

import durable
from tests.crashpoints import Scenario, advance, deliver, effect, explore

pytestmark = [pytest.mark.crashpoints, pytest.mark.django_db(transaction=True)]


@durable.step(name="tests.crash.local_add", local=True)
def local_add(i):
    effect()
    return i + 1


@durable.step(name="tests.crash.add")
def add(i):
    effect()
    return i + 1


@durable.step(name="tests.crash.fails_on")
def fails_on(i, bad):
    effect()
    if i == bad:
        raise durable.ApplicationError(f"{i} is bad", code="bad_item", non_retryable=True)
    return i * 10


@durable.workflow(name="tests.crash.ten_local")
def ten_local(ctx, _):
    return [ctx.step(local_add, i) for i in range(10)]


@durable.workflow(name="tests.crash.ten")
def ten(ctx, _):
    return [ctx.step(add, i) for i in range(10)]


@durable.workflow(name="tests.crash.fan")
def fan(ctx, bad):
    outcomes = ctx.all_settled([ctx.defer(fails_on, i, bad) for i in range(5)])
    return [[o.ok, o.value, o.error.code if o.error else None] for o in outcomes]


@durable.workflow(name="tests.crash.timer_signal")
def timer_signal(ctx, _):
    first = ctx.step(add, 1)
    ctx.sleep("1h")
    got = ctx.wait_for_signal("go")
    return [first, got, ctx.step(add, got)]


@durable.workflow(name="tests.crash.child")
def child(ctx, n):
    return ctx.step(add, n)


@durable.workflow(name="tests.crash.parent")
def parent(ctx, n):
    return ctx.child(child, n) + ctx.step(add, n)


@durable.workflow(name="tests.crash.children_fan")
def children_fan(ctx, n):
    return ctx.all([ctx.defer_child(child, i) for i in range(n)])


def in_place(env):
    env.transport.served_queues = {"durable"}


def signal(env, run_id):
    durable.signal(run_id, "go", 41)


SCENARIOS = [
    Scenario("ten local steps", lambda: durable.start(ten_local).id, [("worker", deliver)]),
    Scenario("ten steps through the broker", lambda: durable.start(ten).id, [("worker", deliver)]),
    Scenario("ten steps in place", lambda: durable.start(ten).id, [("worker", deliver)], prepare=in_place),
    Scenario("a fan of 5, one failing", lambda: durable.start(fan, 2).id, [("worker", deliver)]),
    Scenario(
        "a timer and a signal",
        lambda: durable.start(timer_signal).id,
        [("worker", deliver), ("worker", advance("1h")), ("client", signal), ("worker", deliver)],
    ),
    Scenario("a child", lambda: durable.start(parent, 5).id, [("worker", deliver)]),
    Scenario("a fan of 3 children", lambda: durable.start(children_fan, 3).id, [("worker", deliver)]),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name.replace(" ", "_") for s in SCENARIOS])
def test_every_crash_point_keeps_the_invariants(durable_env, scenario, record_property):
    report = explore(durable_env, scenario)
    record_property("crash_points", report)
    print(f"{scenario.name}: {report}")
