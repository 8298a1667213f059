"""Timers, signals and recorded values through durable_env."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

import pytest
from django.test import override_settings

import durable
from durable.models import Checkpoint, Signal

pytestmark = pytest.mark.django_db


@durable.step
def echo(value):
    return value


@durable.workflow(name="tests.waits_sleep")
def sleep_flow(ctx, seconds):
    before = ctx.now()
    ctx.sleep(seconds)
    return (ctx.now() - before).total_seconds()


@durable.workflow(name="tests.waits_sleep_until")
def sleep_until_flow(ctx, iso):
    ctx.sleep_until(datetime.fromisoformat(iso))
    return "woke"


@durable.workflow(name="tests.waits_signal")
def signal_flow(ctx, timeout):
    try:
        return ctx.wait_for_signal("approve", timeout=timeout)
    except durable.WaitTimeout:
        return "timed out"


@durable.workflow(name="tests.waits_two_signals")
def two_signals_flow(ctx, _):
    ctx.step(echo, "first a step")
    return [ctx.wait_for_signal("item"), ctx.wait_for_signal("item")]


@durable.workflow(name="tests.waits_values")
def values_flow(ctx, _):
    now, ident, rnd = ctx.now(), ctx.uuid4(), ctx.random()
    ctx.step(echo, 1)
    assert isinstance(now, datetime) and isinstance(ident, uuid.UUID) and 0 <= rnd < 1
    return {"now": now.isoformat(), "uuid": str(ident), "random": rnd, "again": ctx.now().isoformat()}


def test_sleep_suspends_until_its_timer_then_resumes(durable_env):
    run = durable.start(sleep_flow, 3600)
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "suspended"
    # The earlier of the timer and the RECONCILE_INTERVAL safety net.
    assert record.wake_at == durable_env.now() + timedelta(minutes=5)
    durable_env.advance_time("59m")
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("1m")
    assert durable.result(run.id) == 3600.0


def test_long_sleep_keeps_a_safety_net_wake(durable_env):
    run = durable.start(sleep_flow, "3d")
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    # The run wakes at least every RECONCILE_INTERVAL, so a lost wake is repaired.
    assert record.wake_at <= durable_env.now() + timedelta(minutes=5)
    durable_env.advance_time("1d")
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("2d")
    assert durable.result(run.id) == 3 * 86400.0


def test_sleep_until_wakes_at_the_given_time(durable_env):
    when = durable_env.now() + timedelta(minutes=10)
    run = durable.start(sleep_until_flow, when.isoformat())
    durable_env.run_until_idle()
    durable_env.advance_time("9m")
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("1m")
    assert durable.result(run.id) == "woke"
    assert Checkpoint.objects.get(run_id=run.id).wake_at == when


def test_signal_resumes_the_waiting_run_with_its_payload(durable_env):
    run = durable.start(signal_flow, None)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    durable.signal(run.id, "approve", {"by": "ann"})
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"by": "ann"}


def test_signal_sent_before_the_wait_is_buffered(durable_env):
    run = durable.start(two_signals_flow)
    durable.signal(run.id, "item", 1)
    durable.signal(run.id, "item", 2)
    durable.signal(run.id, "item", 3)
    durable_env.run_until_idle()
    assert durable.result(run.id) == [1, 2]  # in arrival order, each received once
    assert list(Signal.objects.filter(run_id=run.id).values_list("payload", "consumed_seq")) == [
        (1, 1),
        (2, 2),
        (3, None),
    ]


def test_signal_wait_times_out(durable_env):
    run = durable.start(signal_flow, "1h")
    durable_env.run_until_idle()
    durable_env.advance_time("59m")
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("1m")
    assert durable.result(run.id) == "timed out"


def test_signal_after_the_timeout_is_not_taken(durable_env):
    run = durable.start(signal_flow, "1m")
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    assert durable.result(run.id) == "timed out"
    with pytest.raises(durable.RunFinished):
        durable.signal(run.id, "approve", 1)


def test_values_are_recorded_once_and_replayed(durable_env):
    run = durable.start(values_flow)
    durable_env.run_until_idle()
    first = durable.result(run.id)
    values = {c.name: c.output for c in Checkpoint.objects.filter(run_id=run.id, kind="value")}
    assert first["uuid"] == values["uuid4"]
    assert first["random"] == values["random"]
    assert first["now"] == values["now"]
    assert Checkpoint.objects.filter(run_id=run.id, kind="value").count() == 4


def test_logger_is_quiet_while_replaying(durable_env, caplog):
    @durable.workflow(name="tests.waits_logging")
    def flow(ctx, _):
        ctx.logger.info("before the step")
        ctx.step(echo, 1)
        ctx.logger.info("after the step")
        return ctx.is_replaying

    with caplog.at_level(logging.INFO, logger="durable.workflow"):
        run = durable.start(flow)
        durable_env.run_until_idle()
    messages = [r.getMessage() for r in caplog.records if r.name == "durable.workflow"]
    assert messages == ["before the step", "after the step"]
    assert durable.result(run.id) is False


@override_settings(DURABLE={"ON_NONDETERMINISM": "fail"})
def test_changed_workflow_code_fails_with_non_determinism_when_set_to_fail(durable_env):
    calls = {"n": 0}

    @durable.step(name="tests.waits_other")
    def other(value):
        return value

    @durable.workflow(name="tests.waits_changing")
    def flow(ctx, _):
        calls["n"] += 1
        first = echo if calls["n"] == 1 else other
        ctx.step(first, 1)
        try:
            return ctx.step(echo, 2)
        except durable.NonDeterminismError:
            return "swallowed"

    run = durable.start(flow)
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert record.error["code"] == "non_determinism"
    assert echo.name in record.error["message"] and "tests.waits_other" in record.error["message"]
