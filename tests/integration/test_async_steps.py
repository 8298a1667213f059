"""``async def`` steps under durable_env, dispatched, in place and local: awaited on the process's
loop; their limits cancel them with ``StepTimeout`` raised at the await point; ``heartbeat()``,
``CompleteLater``, retries, typed values and an interrupting cancel work as for sync steps."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from decimal import Decimal

import pytest

import durable
from durable import asyncsteps
from durable.models import AttemptError, Checkpoint

SEEN: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()


@durable.step(name="tests.async_steps.double")
async def double(n: int) -> int:
    await asyncio.sleep(0.01)
    SEEN.append(threading.current_thread().name)
    return n * 2


@durable.step(name="tests.async_steps.flaky", retry=durable.Retry(max_attempts=3, initial="1s"))
async def flaky() -> str:
    await asyncio.sleep(0)
    if durable.step_info().attempt < 2:
        raise ConnectionError("the service is down")
    return f"attempt {durable.step_info().attempt}"


@durable.step(name="tests.async_steps.broken", retry=durable.Retry(max_attempts=1))
async def broken() -> str:
    await asyncio.sleep(0)
    raise ValueError("bad order")


@durable.step(name="tests.async_steps.slow", timeout="300ms", retry=durable.Retry(max_attempts=1))
async def slow() -> str:
    try:
        await asyncio.sleep(10)
    except durable.StepTimeout as exc:
        SEEN.append(f"timed out: {exc}")
        raise
    finally:
        SEEN.append("cleaned up")
    return "never"


@durable.step(
    name="tests.async_steps.beating", heartbeat_timeout="400ms", retry=durable.Retry(max_attempts=1)
)
async def beating() -> str:
    for i in range(6):
        durable.heartbeat({"done": i})  # in time: no limit here
        await asyncio.sleep(0.1)
    SEEN.append("went silent")
    try:
        await asyncio.sleep(10)
    except durable.StepTimeout:
        SEEN.append("silent too long")
        raise
    return "never"


@durable.step(name="tests.async_steps.later")
async def later() -> None:
    SEEN.append(durable.step_info().token)
    raise durable.CompleteLater


@durable.step(name="tests.async_steps.priced")
async def priced(amount: Decimal) -> tuple[Decimal, dt.datetime]:
    await asyncio.sleep(0)
    return amount * 2, dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC)


@durable.step(
    name="tests.async_steps.local", local=True, timeout="300ms", retry=durable.Retry(max_attempts=1)
)
async def local_step(wait: float) -> str:
    try:
        await asyncio.sleep(wait)
    except durable.StepTimeout:
        SEEN.append("local timed out")
        raise
    return "local done"


@durable.step(name="tests.async_steps.waits_long", heartbeat_timeout="1m")
async def waits_long() -> str:
    try:
        await asyncio.sleep(30)  # no heartbeat: the cancel reaches it at this await
    except asyncio.CancelledError:
        SEEN.append("cancelled while awaiting")
        raise
    return "never"


@durable.workflow(name="tests.async_steps.one")
def one(ctx, call):
    step_name, *args = call
    return ctx.step(STEPS[step_name], *args)


@durable.workflow(name="tests.async_steps.fan")
def fan(ctx, _):
    return ctx.all([ctx.defer(double, n) for n in range(5)])


@durable.workflow(name="tests.async_steps.typed")
def typed(ctx, amount):
    doubled, at = ctx.step(priced, Decimal(amount))
    assert isinstance(doubled, Decimal) and isinstance(at, dt.datetime)
    return f"{doubled} at {at.isoformat()}"


@durable.workflow(name="tests.async_steps.cancellable")
def cancellable(ctx, _):
    try:
        return ctx.step(waits_long)
    except durable.Cancelled:
        return "cancelled"


STEPS = {
    "double": double,
    "flaky": flaky,
    "broken": broken,
    "slow": slow,
    "beating": beating,
    "later": later,
    "local": local_step,
}


@pytest.fixture(params=["dispatched", "in place"])
def env(request, db, durable_env, monkeypatch):
    if request.param == "in place":  # as on a worker of the step's queue
        monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    return durable_env


def test_an_async_step_returns_its_value_awaited_on_the_process_loop(env):
    run = durable.start(one, ["double", 21])
    env.run_until_idle()
    assert durable.result(run.id) == 42
    assert SEEN == ["durable-async-steps"]


def test_one_loop_per_process_serves_every_attempt(env):
    run = durable.start(fan)
    env.run_until_idle()
    assert durable.result(run.id) == [0, 2, 4, 6, 8]
    assert asyncsteps.loop() is asyncsteps.loop() and asyncsteps.loop().is_running()


def test_an_async_step_is_retried_under_its_policy(env):
    run = durable.start(one, ["flaky"])
    env.run_until_idle()
    env.advance_time("2s")
    assert durable.result(run.id) == "attempt 2"
    (error,) = AttemptError.objects.filter(run_id=run.id)
    assert error.error["type"] == "ConnectionError" and "flaky" in error.traceback


def test_what_an_async_step_raises_fails_its_run(env):
    run = durable.start(one, ["broken"])
    env.run_until_idle()
    with pytest.raises(durable.RunFailed, match="bad order"):
        durable.result(run.id)


def test_the_timeout_cancels_the_coroutine_with_step_timeout_raised_inside(env):
    run = durable.start(one, ["slow"])
    began = time.monotonic()
    env.run_until_idle()
    assert time.monotonic() - began < 5  # cut at 300 ms, not ten seconds
    assert (
        SEEN[0].startswith("timed out: step 'tests.async_steps.slow' attempt 1") and SEEN[1] == "cleaned up"
    )
    row = Checkpoint.objects.get(run_id=run.id)
    assert (row.status, row.error["type"], row.error["code"]) == ("failed", "StepTimeout", "timeout")
    assert "ran past its timeout of 0.3s" in row.error["message"]


def test_heartbeats_keep_an_async_step_alive_and_silence_times_it_out(env):
    run = durable.start(one, ["beating"])
    env.run_until_idle()
    assert SEEN == ["went silent", "silent too long"]
    row = Checkpoint.objects.get(run_id=run.id)
    assert (row.status, row.error["code"], row.progress) == ("failed", "timeout", {"done": 5})
    assert "gave no heartbeat within its heartbeat_timeout" in row.error["message"]


def test_an_async_step_may_complete_later(env):
    run = durable.start(one, ["later"])
    env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"  # the step is open, awaiting its settle
    durable.complete_step(SEEN[0], output="settled")
    env.run_until_idle()
    assert durable.result(run.id) == "settled"


def test_typed_values_cross_an_async_step_as_a_sync_one(env):
    run = durable.start(typed, "1.10")
    env.run_until_idle()
    assert durable.result(run.id) == "2.20 at 2026-01-02T03:04:00+00:00"


def test_a_local_async_step_runs_inside_the_turn(durable_env):
    run = durable.start(one, ["local", 0.01])
    durable_env.run_until_idle()
    assert durable.result(run.id) == "local done"


def test_a_local_async_step_is_cut_at_its_timeout(durable_env):
    run = durable.start(one, ["local", 10])
    began = time.monotonic()
    durable_env.run_until_idle()
    assert time.monotonic() - began < 5
    assert SEEN == ["local timed out"]
    row = Checkpoint.objects.get(run_id=run.id)
    assert (row.status, row.error["code"]) == ("failed", "timeout")


def test_an_interrupting_cancel_cancels_the_awaiting_coroutine(durable_env, monkeypatch):
    monkeypatch.setattr(asyncsteps, "CANCEL_CHECK", 0.05)
    run = durable.start(cancellable)
    durable_env.run_next()  # the turn sends the step
    durable.cancel(run.id, interrupt=True)
    began = time.monotonic()
    durable_env.run_until_idle()
    assert time.monotonic() - began < 5
    assert SEEN == ["cancelled while awaiting"]
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (row.status, row.error["type"], row.error["code"]) == ("failed", "StepCancelled", "cancelled")
    assert durable.get_run(run.id).status in ("cancelled", "completed")


@durable.step(name="tests.async_steps.remote_triple", remote=True, queue="gpu")
async def remote_triple(x: int) -> int:
    durable.heartbeat({"x": x})
    await asyncio.sleep(0)
    return x * 3


@durable.workflow(name="tests.async_steps.remote")
def remote(ctx, x):
    return ctx.step(remote_triple, x)


def test_a_remote_async_step_runs_as_its_worker_would(durable_env):
    run = durable.start(remote, 5)
    durable_env.run_until_idle()
    assert durable.result(run.id) == 15
    assert Checkpoint.objects.get(run_id=run.id, seq=0).progress == {"x": 5}


@pytest.mark.parametrize("value", [0, -1, "5", True, 2.5])
def test_a_bound_of_async_steps_below_one_or_not_an_int_is_refused(value):
    from durable import conf

    [(key, problem)] = conf.problems({"ASYNC_STEPS_PER_PROCESS": value})
    assert key == "ASYNC_STEPS_PER_PROCESS" and "whole number" in problem
