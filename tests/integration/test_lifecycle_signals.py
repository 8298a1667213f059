"""Lifecycle signals through durable_env: which ones a run sends, in what order, with timings,
only after the change commits, and a receiver that raises changes nothing."""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal

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


@durable.workflow(name="tests.signals.logs")
def logs(ctx, n):
    first = ctx.step(add, n, 1)
    ctx.logger.info("added")
    return first


def test_ctx_logger_records_carry_the_run_workflow_and_position(durable_env, caplog):
    with caplog.at_level(logging.INFO, logger="durable.workflow"):
        handle = durable.start(logs, 1)
        durable_env.run_until_idle()
    (record,) = [r for r in caplog.records if r.getMessage() == "added"]
    assert (record.run_id, record.workflow, record.seq) == (handle.id, "tests.signals.logs", 0)


@pytest.fixture
def spans(monkeypatch):
    """Spans of durable in this test, through the OpenTelemetry SDK's in-memory exporter (a
    provider of the test's own: the global one stays unset for the tests after)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from durable import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", lambda: provider)
    return exporter


def test_every_span_of_a_run_is_in_the_run_s_trace(durable_env, spans):
    from durable import tracing

    handle = durable.start(fails)
    durable_env.run_until_idle()
    durable_env.advance_time("10s")
    mine = [s for s in spans.get_finished_spans() if s.attributes.get("durable.run_id") == handle.id]
    assert {s.context.trace_id for s in mine} == {tracing.trace_id(handle.id)}
    names = [s.name for s in mine]
    assert names.count("durable.start tests.signals.fails") == 1
    assert names.count("durable.step tests.signals.flaky") == 2  # one per attempt
    assert names.count("durable.turn tests.signals.fails") >= 2
    attempts = [s for s in mine if s.name == "durable.step tests.signals.flaky"]
    assert sorted(s.attributes["durable.attempt"] for s in attempts) == [1, 2]
    assert all(s.status.status_code.name == "ERROR" for s in attempts)
    assert {s.attributes["durable.error.type"] for s in attempts} == {"ConnectionError"}


def test_a_local_step_s_attempt_is_reported_by_its_turn_with_its_times(durable_env, spans):
    handle = durable.start(sums, 1)
    assert all("traceparent" in m.options["headers"] for m in durable_env.pending())
    durable_env.run_until_idle()
    (local_span,) = [s for s in spans.get_finished_spans() if s.name == "durable.step tests.signals.local"]
    assert local_span.attributes["durable.run_id"] == handle.id
    assert local_span.end_time >= local_span.start_time


def test_without_opentelemetry_runs_work_and_messages_carry_no_trace_headers(durable_env, monkeypatch):
    from durable import tracing

    monkeypatch.setattr(tracing, "trace", None)
    handle = durable.start(sums, 1)
    assert all("headers" not in m.options for m in durable_env.pending())
    durable_env.run_until_idle()
    assert durable.result(handle.id) == 3


def test_with_the_api_alone_no_message_carries_trace_headers(durable_env):
    # opentelemetry-api installed, no SDK configured: spans do not record, messages stay as they were.
    handle = durable.start(sums, 1)
    assert all("headers" not in m.options for m in durable_env.pending())
    durable_env.run_until_idle()
    assert durable.result(handle.id) == 3


@durable.step(name="tests.signals.price")
def price() -> Decimal:
    return Decimal("12.34")


@durable.workflow(name="tests.signals.priced")
def priced(ctx, _):
    return {"total": ctx.step(price)}


def test_step_completed_and_run_completed_carry_the_output_typed(durable_env, heard):
    durable.start(priced)
    durable_env.run_until_idle()
    outputs = {
        name: kwargs["output"] for name, kwargs in heard if name in ("step_completed", "run_completed")
    }
    assert outputs == {"step_completed": Decimal("12.34"), "run_completed": {"total": Decimal("12.34")}}
    assert type(outputs["step_completed"]) is Decimal
