"""A step's time limits are enforced in the process that runs it, dispatched or in place: the
soft limit raises ``durable.StepTimeout`` inside the step, which may clean up; the attempt fails
with code ``timeout`` and the retry policy decides the rest."""

from __future__ import annotations

import time

import pytest

import durable
from durable import dispatch
from durable.models import Checkpoint

SEEN: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()


@durable.step(timeout="500ms", retry=durable.Retry(max_attempts=2, initial="1s"))
def overruns_once() -> str:
    info = durable.step_info()
    if info.attempt > 1:
        return "second try"
    try:
        time.sleep(10)
    except durable.StepTimeout as exc:
        SEEN.append(f"cleaned up after: {exc}")
        raise
    return "never"


@durable.step(heartbeat_timeout="500ms", retry=durable.Retry(max_attempts=1))
def goes_silent() -> str:
    for _ in range(5):
        durable.heartbeat()
        time.sleep(0.2)  # beats in time: no limit here
    SEEN.append("went silent")
    time.sleep(10)
    return "never"


@durable.workflow(name="tests.time_limits.overrun")
def overrun_flow(ctx, _):
    return ctx.step(overruns_once)


@durable.workflow(name="tests.time_limits.silent")
def silent_flow(ctx, _):
    return ctx.step(goes_silent)


@pytest.fixture(params=["dispatched", "in place"])
def env(request, durable_env, monkeypatch):
    if request.param == "in place":  # as on a worker of the step's queue
        monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    durable_env.in_place = request.param == "in place"
    return durable_env


def test_the_soft_limit_raises_step_timeout_inside_the_step_and_the_attempt_is_retried(env):
    run = durable.start(overrun_flow)
    began = time.monotonic()
    env.run_until_idle()
    assert time.monotonic() - began < 5  # cut short at half a second, not ten
    assert len(SEEN) == 1 and "ran past its timeout" in SEEN[0]
    row = Checkpoint.objects.get(run_id=run.id)
    assert (row.status, row.attempt, row.error["type"], row.error["code"]) == (
        "pending",
        2,
        "StepTimeout",
        "timeout",
    )
    env.advance_time("2s")  # the retry's backoff
    assert durable.result(run.id) == "second try"
    if env.in_place:  # both attempts ran inside turns: no step message was sent
        assert Checkpoint.objects.get(run_id=run.id).enqueued_at is None
    assert not any(m.task == dispatch.RUN_STEP for m in env.pending())


def test_a_step_silent_past_its_heartbeat_timeout_gets_step_timeout(env):
    run = durable.start(silent_flow)
    env.run_until_idle()
    assert SEEN == ["went silent"]
    with pytest.raises(durable.RunFailed) as failure:
        durable.result(run.id)
    assert failure.value.code == "timeout"
    assert "gave no heartbeat" in Checkpoint.objects.get(run_id=run.id).error["message"]
