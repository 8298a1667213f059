"""``Retry(max_attempts=None)``: retry without end, bounded by the run's timeout when it has one."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

FOREVER = durable.Retry(max_attempts=None, initial="1s", backoff=2.0, maximum="10s")
tries: list[int] = []


@durable.step(name="tests.forever.dispatched", retry=FOREVER)
def flaky_dispatched(succeed_at):
    tries.append(durable.step_info().attempt)
    if len(tries) < succeed_at:
        raise ConnectionError(f"try {len(tries)} failed")
    return len(tries)


@durable.step(name="tests.forever.local", local=True, retry=FOREVER)
def flaky_local(succeed_at):
    tries.append(durable.step_info().attempt)
    if len(tries) < succeed_at:
        raise ConnectionError(f"try {len(tries)} failed")
    return len(tries)


@durable.workflow(name="tests.forever.flow")
def flow(ctx, args):
    step = flaky_local if args["local"] else flaky_dispatched
    return ctx.step(step, args["succeed_at"])


@durable.workflow(name="tests.forever.bounded", timeout="10m")
def bounded(ctx, args):
    return ctx.step(flaky_dispatched, args["succeed_at"])


@pytest.fixture(autouse=True)
def _fresh():
    tries.clear()


@pytest.mark.parametrize("local", [False, True], ids=["dispatched", "local"])
def test_a_step_retries_past_any_default_until_it_succeeds(durable_env, local):
    run = durable.start(flow, {"local": local, "succeed_at": 40})
    durable_env.run_until_idle()
    for _ in range(60):
        if durable.get_run(run.id).status == "completed":
            break
        durable_env.advance_time("13s")  # past the capped backoff and its jitter
    assert durable.result(run.id) == 40
    assert tries == list(range(1, 41))
    assert Checkpoint.objects.get(run_id=run.id, seq=0).attempt == 40


def test_the_runs_timeout_bounds_endless_retries(durable_env):
    run = durable.start(bounded, {"succeed_at": 10**9})
    durable_env.run_until_idle()
    for _ in range(80):
        if durable.get_run(run.id).status != "suspended":
            break
        durable_env.advance_time("13s")
    with pytest.raises(durable.RunFailed) as failed:
        durable.result(run.id)
    assert failed.value.code == "timeout"
    assert 40 <= len(tries) < 60  # about 10 minutes of 10-12 s backoffs


def test_retry_without_end_is_accepted_and_zero_is_still_refused():
    assert FOREVER.allows_after(10**6)
    assert not durable.Retry(max_attempts=2).allows_after(2)
    with pytest.raises(durable.InvalidInput, match="1 or more"):
        durable.Retry(max_attempts=0)
    with pytest.raises(durable.InvalidInput, match="None to retry without end"):
        durable.Retry(max_attempts="forever")
