"""Timers due soon fire on time with no beat running: a turn that suspends on a retry's backoff
or a short sleep also sends itself a Celery countdown (``dispatch.advance_at``); the run's
``wake_at`` stays the timer, and beat's sweep only repairs what a lost countdown left."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable import Retry
from durable.models import AttemptError, Checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

#: How late a timer may fire: its countdown runs out on a worker that is idle but for it.
SLACK = timedelta(seconds=2)


@durable.step(name="tests.e2e_short_timers.flaky", retry=Retry(max_attempts=2, initial="500ms"))
def flaky() -> int:
    if durable.step_info().attempt == 1:
        raise ConnectionError("the first attempt always fails")
    return durable.step_info().attempt


@durable.step(name="tests.e2e_short_timers.echo")
def echo(value: str) -> str:
    return value


@durable.workflow(name="tests.e2e_short_timers.backoff_then_nap")
def backoff_then_nap(ctx: durable.Context, _: None) -> list:
    attempt = ctx.step(flaky)
    ctx.sleep("1s")
    return [attempt, ctx.step(echo, "rested")]


def test_a_retry_backoff_and_a_short_sleep_fire_on_time_without_beat(durable_worker):
    assert durable_worker.beat is None  # nothing sweeps: only the countdowns can wake the run
    run = durable.start(backoff_then_nap)
    assert durable.result(run.id, timeout=30) == [2, "rested"]

    failed = AttemptError.objects.get(run_id=run.id, attempt=1)
    retried = Checkpoint.objects.get(run_id=run.id, kind="step", name="tests.e2e_short_timers.flaky")
    backoff_due = failed.failed_at + timedelta(milliseconds=500)
    assert backoff_due <= retried.started_at <= backoff_due + SLACK, (failed.failed_at, retried.started_at)

    nap = Checkpoint.objects.get(run_id=run.id, kind="sleep")
    assert nap.wake_at <= nap.finished_at <= nap.wake_at + SLACK, (nap.wake_at, nap.finished_at)
