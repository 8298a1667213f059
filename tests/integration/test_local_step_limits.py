"""``local=True`` steps with ``timeout=`` and ``heartbeat_timeout=``: enforced inside the turn as for
steps run in place (the hard limit on a real worker: ``tests/e2e/test_step_time_limits_e2e.py``)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import durable
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

SEEN: list[tuple[int, str, bool]] = []


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()


@durable.step(local=True, timeout="300ms", retry=durable.Retry(max_attempts=2, initial="1s"))
def slow_then_quick(n: int) -> int:
    info = durable.step_info()
    row = Checkpoint.objects.get(run_id=info.run_id, seq=info.seq)
    SEEN.append((info.attempt, row.status, row.started_at is not None))
    if info.attempt == 1:
        time.sleep(5)  # cut short by StepTimeout at 300 ms
    return n + 1


@durable.workflow(name="tests.local_limits.timed")
def timed(ctx, n):
    return ctx.step(slow_then_quick, n)


@durable.step(local=True, heartbeat_timeout="300ms", retry=durable.Retry(max_attempts=1))
def goes_quiet() -> str:
    for _ in range(3):
        durable.heartbeat({"alive": True})
        time.sleep(0.1)
    time.sleep(5)  # no beat for longer than heartbeat_timeout
    return "never"


@durable.workflow(name="tests.local_limits.quiet")
def quiet(ctx, _):
    try:
        return ctx.step(goes_quiet)
    except durable.StepFailed as exc:
        return exc.cause["code"]


def test_a_local_step_past_its_timeout_is_cut_short_and_retried_under_its_policy(durable_env):
    run = durable.start(timed, 41)
    began = time.monotonic()
    durable_env.run_until_idle()
    assert time.monotonic() - began < 4, "the step was not cut short at its timeout"
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (row.status, row.attempt, row.error["code"]) == ("pending", 2, "timeout")
    durable_env.advance_time(timedelta(seconds=2))
    assert durable.result(run.id) == 42
    # Each attempt found its row written as started before it ran, as a step run in place does.
    assert SEEN == [(1, "pending", True), (2, "pending", True)]
    assert Checkpoint.objects.get(run_id=run.id, seq=0).attempt == 2


def test_a_local_step_silent_past_its_heartbeat_timeout_fails_with_timeout(durable_env):
    run = durable.start(quiet)
    began = time.monotonic()
    durable_env.run_until_idle()
    assert time.monotonic() - began < 4
    assert durable.result(run.id) == "timeout"
    assert Checkpoint.objects.get(run_id=run.id, seq=0).progress == {"alive": True}
