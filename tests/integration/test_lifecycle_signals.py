"""Lifecycle signals through durable_env: which ones a run sends, in what order, with timings,
only after the change commits, and a receiver that raises changes nothing."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import transaction

import durable
from durable import Retry, signals
from durable.models import Run

pytestmark = pytest.mark.django_db

ALL = [
    "run_started",
    "run_suspended",
    "run_completed",
    "run_failed",
    "run_cancelled",
    "run_dead",
    "step_started",
    "step_completed",
    "step_failed",
    "step_retried",
]


@pytest.fixture
def heard():
    """Every lifecycle signal received, as (signal name, kwargs), in order."""
    events: list[tuple[str, dict]] = []
    receivers = []
    for name in ALL:

        def receive(sender, signal=None, _name=name, **kwargs):
            events.append((_name, kwargs))

        getattr(signals, name).connect(receive, weak=False)
        receivers.append((name, receive))
    yield events
    for name, receive in receivers:
        getattr(signals, name).disconnect(receive)


@durable.step(name="tests.signals.add")
def add(a: int, b: int) -> int:
    return a + b


@durable.step(name="tests.signals.local", local=True)
def local(n: int) -> int:
    return n + 1


@durable.step(name="tests.signals.flaky", retry=Retry(max_attempts=2, initial="5s"))
def flaky() -> None:
    raise ConnectionError(f"attempt {durable.step_info().attempt} failed")


@durable.workflow(name="tests.signals.sums")
def sums(ctx, n):
    one = ctx.step(add, n, 1)
    return ctx.step(local, one)


@durable.workflow(name="tests.signals.fails")
def fails(ctx, _):
    ctx.step(flaky)


@durable.workflow(name="tests.signals.waits")
def waits(ctx, _):
    return ctx.wait_for_signal("go")


def names(events):
    return [name for name, _ in events]


def test_a_run_sends_started_suspended_step_signals_and_completed_in_order(durable_env, heard):
    handle = durable.start(sums, 1)
    assert heard == []  # nothing before the first turn
    durable_env.advance_time("1s")
    durable_env.run_until_idle()
    assert names(heard) == [
        "run_started",
        "run_suspended",
        "step_started",
        "step_completed",
        "step_started",
        "step_completed",
        "run_completed",
    ]
    started = heard[0][1]
    assert started["run_id"] == handle.id
    assert started["workflow"] == "tests.signals.sums"
    assert started["queue_wait"] == timedelta(seconds=1)  # created, then a second until its turn
    dispatched = heard[3][1]
    assert (dispatched["name"], dispatched["attempt"], dispatched["output"]) == ("tests.signals.add", 1, 2)
    assert dispatched["queue_wait"] >= timedelta(0) and dispatched["duration"] >= timedelta(0)
    assert heard[5][1]["name"] == "tests.signals.local" and heard[5][1]["output"] == 3
    completed = heard[-1][1]
    assert completed["output"] == 3 and completed["status"] == "completed"
    assert completed["duration"] >= timedelta(0)


def test_a_failing_step_sends_retried_then_failed_and_the_run_failed(durable_env, heard):
    handle = durable.start(fails)
    durable_env.run_until_idle()
    durable_env.advance_time("10s")
    assert [n for n in names(heard) if n.startswith("step_") or n == "run_failed"] == [
        "step_started",
        "step_retried",
        "step_started",
        "step_failed",
        "run_failed",
    ]
    retried = dict(heard)["step_retried"]
    assert retried["attempt"] == 1 and retried["error"]["type"] == "ConnectionError"
    assert retried["retry_at"] is not None
    failed = dict(heard)["step_failed"]
    assert failed["attempt"] == 2
    assert dict(heard)["run_failed"]["error"]["code"] is None
    assert durable.get_run(handle.id).status == "failed"


def test_cancel_sends_run_cancelled_only_when_its_transaction_commits(durable_env, heard):
    handle = durable.start(waits)
    durable_env.run_until_idle()
    heard.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.cancel(handle.id)
        raise RuntimeError("roll back")
    durable_env.run_until_idle()
    assert heard == []
    durable.cancel(handle.id, reason="changed my mind")
    assert heard == []  # the test's transaction has not committed yet
    durable_env.run_until_idle()
    assert names(heard) == ["run_cancelled"]
    assert heard[0][1]["error"]["message"] == "changed my mind"


def test_a_receiver_that_raises_is_logged_and_changes_nothing(durable_env, caplog):
    def broken(sender, **kwargs):
        raise ValueError("receiver bug")

    signals.run_completed.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            handle = durable.start(sums, 1)
            durable_env.run_until_idle()
    finally:
        signals.run_completed.disconnect(broken)
    assert durable.result(handle.id) == 3
    assert Run.objects.get(id=handle.id).status == "completed"
    assert "receiver bug" in caplog.text


def test_lifecycle_log_records_carry_the_run_id_and_position(durable_env, caplog):
    with caplog.at_level(logging.DEBUG, logger="durable.lifecycle"):
        handle = durable.start(sums, 1)
        durable_env.run_until_idle()
    steps = [r for r in caplog.records if r.name == "durable.lifecycle" and hasattr(r, "seq")]
    assert {(r.run_id, r.seq, r.step) for r in steps} == {
        (handle.id, 0, "tests.signals.add"),
        (handle.id, 1, "tests.signals.local"),
    }
    ended = [r for r in caplog.records if getattr(r, "status", None) == "completed"]
    assert ended and ended[0].run_id == handle.id and ended[0].workflow == "tests.signals.sums"
