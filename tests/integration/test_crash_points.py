"""Every crash point of each scenario, one kill per run, and the invariants checked after each
(see tests/crashpoints.py and docs/guarantees.md, "Checked at every crash point")."""

from __future__ import annotations

import asyncio
import os

import pytest

import durable
from tests.crashpoints import DOUBLE, DROP, REORDER, Scenario, advance, deliver, effect, explore

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


@durable.step(name="tests.crash.reserve")
def reserve(i):
    effect()
    return f"res-{i}"


@reserve.compensation
def release(reservation, i):
    effect()


@durable.workflow(name="tests.crash.saga")
def saga(ctx, bad):
    for i in range(3):
        ctx.step(reserve, i)
    return ctx.step(fails_on, bad, bad)


# Three attempts: a kill costs the attempt it cut (as a lost worker does), and the run still
# completes as the fault-free one did.
@durable.step(name="tests.crash.flaky", retry=durable.Retry(max_attempts=3, initial="500ms"))
def flaky(i):
    effect()
    if durable.step_info().attempt == 1:
        raise ConnectionError("the first attempt fails")
    return i


@durable.workflow(name="tests.crash.backoff")
def backoff(ctx, n):
    return ctx.step(flaky, n) + ctx.step(add, n)


@durable.workflow(name="tests.crash.async_gather")
async def async_gather(ctx, n):
    values = await asyncio.gather(*(ctx.step(add, i) for i in range(n)))
    await ctx.sleep("1s")
    return [*values, await ctx.step(add, sum(values))]


# One slot for the fan's two members: the second waits durably for the first's, whichever way
# the first attempt ends (a kill included: its slot is freed when its hold lapses).
@durable.step(name="tests.crash.limited", concurrency=1)
def limited(i):
    effect()
    return i


@durable.workflow(name="tests.crash.limited_fan")
def limited_fan(ctx, n):
    return ctx.all([ctx.defer(limited, i) for i in range(n)])


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
    Scenario("a saga compensating 3 steps", lambda: durable.start(saga, 1).id, [("worker", deliver)]),
    Scenario(
        "a retry after its backoff",
        lambda: durable.start(backoff, 1).id,
        [("worker", deliver), ("worker", advance("1s"))],
    ),
    Scenario(
        "a fan of 2 under a concurrency of 1", lambda: durable.start(limited_fan, 2).id, [("worker", deliver)]
    ),
    Scenario(
        "an async gather of 3 and a sleep",
        lambda: durable.start(async_gather, 3).id,
        [("worker", deliver), ("worker", advance("1s"))],
    ),
]


def shard(scenarios: list[Scenario]) -> list[Scenario]:
    """The scenarios of this process: all, or with ``DURABLE_CRASH_SHARD=i/n`` every n-th from
    the i-th (CI runs two shards, each beside one half of the end-to-end tests)."""
    given = os.environ.get("DURABLE_CRASH_SHARD")
    if not given:
        return scenarios
    i, n = (int(part) for part in given.split("/"))
    return scenarios[i - 1 :: n]


@pytest.mark.parametrize("scenario", shard(SCENARIOS), ids=lambda s: s.name.replace(" ", "_"))
def test_every_crash_point_keeps_the_invariants(durable_env, scenario, record_property):
    report = explore(durable_env, scenario)
    record_property("crash_points", report)
    print(f"{scenario.name}: {report}")


@pytest.mark.parametrize("fault", [DROP, DOUBLE, REORDER])
@pytest.mark.parametrize("scenario", shard(SCENARIOS), ids=lambda s: s.name.replace(" ", "_"))
def test_every_message_lost_doubled_or_reordered_keeps_the_invariants(
    durable_env, scenario, fault, record_property
):
    report = explore(durable_env, scenario, fault=fault)
    record_property("message_faults", report)
    print(f"{scenario.name}, each message {fault}: {report}")
