"""End to end, on a real worker: the lifecycle signals a run sends there, and one OpenTelemetry
trace from ``start()`` in this process through the turn and the dispatched step on the worker.

The worker imports this module (``--include``); with ``DURABLE_TEST_OBSERVE_DIR`` set it writes
what its receivers heard, and the spans its SDK exported, to files in that folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durable
from durable import signals, tracing
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

OBSERVE_DIR = os.environ.get("DURABLE_TEST_OBSERVE_DIR")
HEARD = [
    "run_started",
    "run_suspended",
    "run_completed",
    "run_failed",
    "step_started",
    "step_completed",
    "step_failed",
    "step_retried",
]


class FileExporter(SpanExporter):
    """Appends each finished span to a file as one JSON line (the worker's side of the test)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Any) -> SpanExportResult:
        with open(self.path, "a") as f:
            for span in spans:
                f.write(json.dumps(_shape(span)) + "\n")
        return SpanExportResult.SUCCESS


def _shape(span: Any) -> dict[str, Any]:
    return {
        "name": span.name,
        "trace_id": span.context.trace_id,
        "span_id": span.context.span_id,
        "parent": span.parent.span_id if span.parent else None,
        "links": [link.context.span_id for link in span.links],
        "attributes": dict(span.attributes or {}),
        "pid": os.getpid(),
    }


def _note(name: str):
    def receive(sender: Any, **facts: Any) -> None:
        line = {
            "signal": name,
            "run_id": facts["run_id"],
            "seq": facts.get("seq"),
            "attempt": facts.get("attempt"),
            "queue_wait": facts["queue_wait"].total_seconds()
            if facts.get("queue_wait") is not None
            else None,
            "duration": facts["duration"].total_seconds() if facts.get("duration") is not None else None,
            # Sent after the commit: never inside the transaction of the change it reports.
            "in_transaction": connection.in_atomic_block,
        }
        with open(Path(OBSERVE_DIR) / "signals.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    return receive


if OBSERVE_DIR:  # inside the worker
    _worker_provider = TracerProvider()
    _worker_provider.add_span_processor(SimpleSpanProcessor(FileExporter(Path(OBSERVE_DIR) / "spans.jsonl")))
    trace.set_tracer_provider(_worker_provider)
    _receivers = [_note(name) for name in HEARD]
    for _name, _receiver in zip(HEARD, _receivers, strict=True):
        getattr(signals, _name).connect(_receiver)

    def _broken(sender: Any, **facts: Any) -> None:
        raise RuntimeError("a receiver with a bug")

    signals.step_completed.connect(_broken)


@durable.step(name="tests.e2e_observe.pack", timeout="30s")
def pack(order: int) -> str:
    return f"box-{order}"


@durable.workflow(name="tests.e2e_observe.ship")
def ship(ctx, order):
    return ctx.step(pack, order)


@pytest.fixture
def durable_worker_options(tmp_path):
    # EAGER_STEPS off: the step crosses the broker to a worker, as the trace under test must.
    return {"env": {"DURABLE_TEST_OBSERVE_DIR": str(tmp_path), "DURABLE_EAGER_STEPS": "false"}}


@pytest.fixture
def memory_spans(monkeypatch):
    """This process's spans, in the SDK's in-memory exporter (a provider of the test's own)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", lambda: provider)
    return provider, exporter


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_run_on_a_real_worker_sends_its_lifecycle_signals_with_timings(durable_worker, tmp_path):
    handle = durable.start(ship, 7)
    assert durable.result(handle.id, timeout=60) == "box-7"
    heard = wait_for(
        lambda: (
            [e for e in _lines(tmp_path / "signals.jsonl") if e["run_id"] == handle.id]
            if any(e["signal"] == "run_completed" for e in _lines(tmp_path / "signals.jsonl"))
            else None
        ),
        timeout=30,
        what="run_completed from the worker",
    )
    assert [e["signal"] for e in heard] == [
        "run_started",
        "run_suspended",
        "step_started",
        "step_completed",
        "run_completed",
    ]
    by_name = {e["signal"]: e for e in heard}
    assert by_name["step_completed"]["seq"] == 0 and by_name["step_completed"]["attempt"] == 1
    assert by_name["step_started"]["queue_wait"] >= 0  # sent to started
    assert by_name["step_completed"]["duration"] >= 0
    assert by_name["run_started"]["queue_wait"] >= 0
    assert by_name["run_completed"]["duration"] >= by_name["step_completed"]["duration"]
    assert not any(e["in_transaction"] for e in heard)
    # A receiver that raises (connected to step_completed in the worker) is logged; the run went on.
    assert "a receiver with a bug" in durable_worker.logs()


def test_one_trace_from_start_through_the_dispatched_step_on_a_real_worker(
    durable_worker, tmp_path, memory_spans
):
    provider, memory_spans = memory_spans
    with provider.get_tracer("tests").start_as_current_span("POST /orders") as request:
        handle = durable.start(ship, 8)
    assert durable.result(handle.id, timeout=60) == "box-8"

    (started,) = [
        s for s in memory_spans.get_finished_spans() if s.name == "durable.start tests.e2e_observe.ship"
    ]
    assert started.attributes["durable.run_id"] == handle.id
    run_trace = started.context.trace_id
    assert run_trace == tracing.trace_id(handle.id)
    assert [link.context.span_id for link in started.links] == [request.get_span_context().span_id]

    def worker_spans():
        spans = [
            s for s in _lines(tmp_path / "spans.jsonl") if s["attributes"].get("durable.run_id") == handle.id
        ]
        # The turn after the step may run inside the step's span (replayed ahead): that turn's
        # span ends, and is exported, before the step's own.
        names = [s["name"] for s in spans]
        done = (
            "durable.step tests.e2e_observe.pack" in names
            and sum(n.startswith("durable.turn") for n in names) >= 2
        )
        return spans if done else None

    spans = wait_for(worker_spans, timeout=30, what="the worker's spans of the run")
    assert {s["trace_id"] for s in spans} == {run_trace}
    assert all(s["pid"] != os.getpid() for s in spans)  # exported by the worker
    (step,) = [s for s in spans if s["name"] == "durable.step tests.e2e_observe.pack"]
    turns = {s["span_id"]: s for s in spans if s["name"] == "durable.turn tests.e2e_observe.ship"}
    # start() -> first turn (through the advance message's headers) -> step (through run_step's)
    first = turns[step["parent"]]
    assert first["parent"] == started.context.span_id
    assert (step["attributes"]["durable.seq"], step["attributes"]["durable.attempt"]) == (0, 1)
    # The turn after the step hangs under it, and completes the run.
    assert any(
        t["parent"] == step["span_id"] and t["attributes"].get("durable.outcome") == "completed"
        for t in turns.values()
    )
