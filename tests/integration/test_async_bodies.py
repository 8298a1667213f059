"""``async def`` workflow bodies through durable_env: every waiting primitive awaited, gather as
a fan, cancels, sagas, children, continue-as-new, patches, typed values, and what a body may not
await."""

from __future__ import annotations

import asyncio
import dataclasses
from decimal import Decimal

import pytest

import durable
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@dataclasses.dataclass
class Order:
    id: int
    total: Decimal


@durable.step(name="tests.async_bodies.double")
def double(x: int) -> int:
    RAN.append(f"double {x}")
    return x * 2


@durable.step(name="tests.async_bodies.charge")
def charge(order: Order) -> Order:
    RAN.append("charge")
    return Order(order.id, order.total + 1)


@charge.compensation
def refund(charged: Order, order: Order) -> None:
    RAN.append(f"refund {charged.id}")


@durable.step(name="tests.async_bodies.ship", retry=durable.Retry(max_attempts=1))
def ship(order: Order) -> None:
    raise durable.ApplicationError("no courier", non_retryable=True)


@durable.workflow(name="tests.async_bodies.child")
async def child(ctx, x: int) -> int:
    return await ctx.step(double, x) + 1


@durable.workflow(name="tests.async_bodies.every")
async def every(ctx, _):
    out = {"step": await ctx.step(double, 1)}
    await ctx.sleep("1m")
    await ctx.sleep_until(ctx.now() + __import__("datetime").timedelta(minutes=1))
    out["signal"] = await ctx.wait_for_signal("go")
    out["any"] = list(await ctx.wait_for_any_signal(["left", "right"]))
    update = await ctx.wait_for_update("bump")
    ctx.reply(update, update.payload + 1)
    out["update"] = update.payload
    out["child"] = await ctx.child(child, 5)
    out["all"] = await ctx.all([ctx.defer(double, 2), ctx.defer_child(child, 3)])
    out["settled"] = [o.ok for o in await ctx.all_settled([ctx.defer(double, 4)])]
    out["map"] = await ctx.map(double, [5, 6])
    out["patched"] = ctx.patched("v2")
    return out


def test_every_waiting_primitive_is_awaited_in_an_async_body(durable_env):
    run = durable.start(every)
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    durable.signal(run.id, "go", "went")
    durable.signal(run.id, "right", 7)
    durable_env.run_until_idle()
    durable.update(run.id, "bump", 41)
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "completed", record.error
    assert record.output == {
        "step": 2,
        "signal": "went",
        "any": ["right", 7],
        "update": 41,
        "child": 11,
        "all": [4, 7],
        "settled": [True],
        "map": [10, 12],
        "patched": True,
    }


@durable.workflow(name="tests.async_bodies.gathered")
async def gathered(ctx, _):
    return list(await asyncio.gather(ctx.step(double, 1), ctx.step(double, 2), ctx.step(double, 3)))


@durable.workflow(name="tests.async_bodies.all_of")
def all_of(ctx, _):
    return ctx.all([ctx.defer(double, 1), ctx.defer(double, 2), ctx.defer(double, 3)])


def _rows(run_id):
    return list(
        Checkpoint.objects.filter(run_id=run_id).order_by("seq").values_list("kind", "name", "seq", "fan")
    )


def test_gather_of_three_steps_writes_the_rows_ctx_all_writes(durable_env):
    async_run, sync_run = durable.start(gathered), durable.start(all_of)
    durable_env.run_until_idle()
    assert _rows(async_run.id) == _rows(sync_run.id) == [("step", double.name, seq, 0) for seq in range(3)]
    assert durable.get_run(async_run.id).output == durable.get_run(sync_run.id).output == [2, 4, 6]
    assert sorted(RAN) == sorted(["double 1", "double 2", "double 3"] * 2)


@durable.workflow(name="tests.async_bodies.tasks")
async def tasks(ctx, _):
    first = asyncio.create_task(ctx.step(double, 10))
    signal = asyncio.create_task(ctx.wait_for_signal("go"))
    return [await first, await signal, await ctx.step(double, 11)]


def test_create_task_of_primitives_and_a_signal_that_comes_later(durable_env):
    run = durable.start(tasks)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    durable.signal(run.id, "go", "late")
    durable_env.run_until_idle()
    assert durable.get_run(run.id).output == [20, "late", 22]
    assert RAN == ["double 10", "double 11"]


@durable.workflow(name="tests.async_bodies.sleeps_and_waits")
async def sleeps_and_waits(ctx, _):
    await ctx.sleep("1h")
    return await ctx.wait_for_signal("go")


def test_a_sleep_then_a_signal(durable_env):
    run = durable.start(sleeps_and_waits)
    durable_env.run_until_idle()
    durable.signal(run.id, "go", "early")  # buffered while the body sleeps
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("1h")
    durable_env.run_until_idle()
    assert durable.get_run(run.id).output == "early"


@durable.workflow(name="tests.async_bodies.cancellable")
async def cancellable(ctx, _):
    try:
        await ctx.wait_for_signal("never")
    except durable.Cancelled:
        RAN.append("cancelled at the wait")
        await ctx.step(double, 0)  # cleanup after the cancel still runs
        raise
    finally:
        RAN.append("finally")


def test_a_cancel_is_raised_at_the_awaited_primitive_and_finally_runs(durable_env):
    run = durable.start(cancellable)
    durable_env.run_until_idle()
    RAN.clear()
    durable.cancel(run.id, interrupt=True, reason="operator")
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "cancelled"
    assert RAN[0] == "cancelled at the wait" and "double 0" in RAN and RAN[-1] == "finally"


@durable.workflow(name="tests.async_bodies.saga")
async def saga(ctx, order: Order):
    await ctx.step(charge, order)
    await ctx.step(ship, order)


def test_a_failure_in_an_async_body_compensates_completed_steps(durable_env):
    run = durable.start(saga, Order(7, Decimal("1.5")))
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert RAN == ["charge", "refund 7"]


@durable.workflow(name="tests.async_bodies.again")
async def again(ctx, n: int):
    total = await ctx.step(double, n)
    if n < 3:
        ctx.continue_as_new(n + 1)
    return total


def test_continue_as_new_from_an_async_body(durable_env):
    run = durable.start(again, 1)
    durable_env.run_until_idle()
    successor = durable.get_run(run.id).output["continued_as"]
    successor = durable.get_run(successor).output["continued_as"]
    assert durable.get_run(successor).output == 6
    assert RAN == ["double 1", "double 2", "double 3"]


@durable.workflow(name="tests.async_bodies.clock")
async def clock(ctx, _):
    await ctx.step(double, 1)
    await asyncio.sleep(1)


def test_asyncio_sleep_fails_the_run_with_nondeterministic_await_naming_it(durable_env):
    run = durable.start(clock)
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert record.error["code"] == "nondeterministic_await"
    assert "asyncio.sleep()" in record.error["message"] and "test_async_bodies.py" in record.error["message"]


SEEN: list[object] = []


@durable.workflow(name="tests.async_bodies.typed")
async def typed(ctx, order: Order) -> Order:
    SEEN.append(order)
    charged = await ctx.step(charge, order)
    SEEN.append(charged)
    await ctx.sleep("1s")
    return charged


def test_the_body_sees_the_same_typed_values_on_the_first_turn_and_on_replay(durable_env):
    SEEN.clear()
    run = durable.start(typed, Order(1, Decimal("2.50")))
    durable_env.run_until_idle()
    durable_env.advance_time("1s")
    durable_env.run_until_idle()
    given, charged = Order(1, Decimal("2.50")), Order(1, Decimal("3.50"))
    assert SEEN[0] == given and SEEN[-4:] == [given, charged, given, charged]
    assert all(type(seen) is Order and type(seen.total) is Decimal for seen in SEEN)
    assert durable.result(run.id) == Order(1, Decimal("3.50"))


@durable.workflow(name="tests.async_bodies.remote", remote=True, queue="ab-turns")
async def remote_body(ctx, x: int):
    said = asyncio.create_task(ctx.wait_for_signal("go"))
    doubled = await asyncio.gather(ctx.step(double, x), ctx.step(double, x + 1))
    return {"doubled": list(doubled), "said": await said}


def test_an_async_body_replays_on_remote_turns(durable_env, monkeypatch):
    from durable import remote

    turns = []
    replayed = remote._replay
    monkeypatch.setattr(remote, "_replay", lambda *args: turns.append(args[1].id) or replayed(*args))
    run = durable.start(remote_body, 5)
    durable_env.run_until_idle()
    durable.signal(run.id, "go", "now")
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"doubled": [10, 12], "said": "now"}
    assert [row[:3] for row in _rows(run.id)] == [
        ("signal", "go", 0),
        ("step", double.name, 1),
        ("step", double.name, 2),
        ("resumed", "resumed", 3),  # the steps' results were resumed before the signal came
    ]
    assert len(turns) >= 2 and set(turns) == {run.id}  # every turn replayed the body remotely


@durable.workflow(name="tests.async_bodies.talks")
async def talks(ctx, listener: str):
    ctx.signal(listener, "go", "from a body")  # looks the run up in the database, off the loop
    return ctx.start(sleeps_and_waits)


def test_quick_primitives_that_query_the_database_run_in_an_async_body(durable_env):
    listener = durable.start(sleeps_and_waits)
    run = durable.start(talks, listener.id)
    durable_env.run_until_idle()
    started = durable.result(run.id)
    durable_env.advance_time("1h")
    durable_env.run_until_idle()
    assert durable.result(listener.id) == "from a body"
    assert durable.get_run(started).status == "suspended"
