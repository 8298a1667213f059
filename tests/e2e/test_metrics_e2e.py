"""End to end, on a real prefork worker: after real runs, each instrument of durable.metrics with
its attributes, read from the worker's OpenTelemetry SDK (an in-memory reader) and through
``durable.metrics_view`` in this process (the worker's tallies, shared through
``DURABLE["METRICS_DIR"]`` as on one host, and the gauges read from the database).

The worker imports this module (``--include``); with ``DURABLE_TEST_METRICS_DIR`` set it installs
an SDK meter provider with an in-memory reader, and each pool process writes what that reader
collects to a file there, twice a second.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from celery import signals as celery_signals

import durable
from durable.metrics.instruments import COUNTER, INSTRUMENTS
from durable.testing import _purge, wait_for
from tests.metrics_readings import prometheus_samples, value

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

METRICS_DIR = os.environ.get("DURABLE_TEST_METRICS_DIR")
NOBODY = "tests-metrics-nobody"  # a queue no worker consumes: its step waits, unstarted
TOKEN = secrets.token_urlsafe(32)

if METRICS_DIR:  # inside the worker
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    _reader = InMemoryMetricReader()
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))

    def _dump_forever() -> None:
        path = Path(METRICS_DIR) / f"otel-{os.getpid()}.json"
        while True:
            data = _reader.get_metrics_data()
            if data is not None:
                partial = path.with_suffix(".part")
                partial.write_text(data.to_json())
                partial.replace(path)
            time.sleep(0.5)

    @celery_signals.worker_process_init.connect
    def _start_dumping(**_: Any) -> None:
        threading.Thread(target=_dump_forever, daemon=True, name="metrics-dump").start()


@durable.step(name="tests.e2e_metrics.pack", timeout="30s")
def pack(order: int) -> str:
    return f"box-{order}"


@durable.step(name="tests.e2e_metrics.explode", retry=durable.Retry(max_attempts=1))
def explode() -> None:
    raise ValueError("no such order")


@durable.step(name="tests.e2e_metrics.nowhere", queue=NOBODY)
def nowhere() -> None:
    return None


@durable.workflow(name="tests.e2e_metrics.ship")
def ship(ctx, order):
    return ctx.step(pack, order)


@durable.workflow(name="tests.e2e_metrics.broken")
def broken(ctx, _):
    ctx.step(explode)


@durable.workflow(name="tests.e2e_metrics.stuck")
def stuck(ctx, _):
    ctx.step(nowhere)


@pytest.fixture
def durable_worker_options(tmp_path):
    (tmp_path / "prometheus").mkdir()
    return {
        "env": {
            "DURABLE_TEST_METRICS_DIR": str(tmp_path),
            "DURABLE_METRICS_DIR": str(tmp_path / "prometheus"),
            # The step crosses the broker to a pool process: its queue wait is measured.
            "DURABLE_EAGER_STEPS": "false",
        }
    }


def _worker_points(folder: Path) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """The in-memory readers' data of every pool process, by instrument name."""
    found: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for path in folder.glob("otel-*.json"):
        data = json.loads(path.read_text())
        for resource in data["resource_metrics"]:
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    for point in metric["data"]["data_points"]:
                        number = point["count"] if "bucket_counts" in point else point["value"]
                        found.setdefault(metric["name"], []).append((point["attributes"], number))
    return found


def test_a_worker_s_metrics_after_real_runs_through_its_sdk_and_the_prometheus_view(
    durable_worker, tmp_path, client, settings
):
    done = durable.start(ship, 7)
    failed = durable.start(broken)
    waiting = durable.start(stuck)
    assert durable.result(done.id, timeout=60) == "box-7"
    with pytest.raises(durable.RunFailed):
        durable.result(failed.id, timeout=60)
    wait_for(
        lambda: durable.get_run(waiting.id).status == "suspended", timeout=60, what="the stuck run to wait"
    )
    queue = durable.get_run(done.id).queue or "durable"

    ship_run = {"workflow": "tests.e2e_metrics.ship", "namespace": ""}
    broken_run = {"workflow": "tests.e2e_metrics.broken", "namespace": ""}
    packed = {"step": "tests.e2e_metrics.pack", "namespace": ""}
    expected = {
        # instrument: (attributes a point must carry, at least this value)
        "durable.runs.started": (ship_run, 1),
        "durable.runs.completed": (ship_run, 1),
        "durable.runs.failed": (broken_run, 1),
        "durable.steps.attempts": ({**packed, "outcome": "completed"}, 1),
        "durable.step.duration": ({**packed, "outcome": "completed"}, 1),
        "durable.step.queue_wait": (packed, 1),
        "durable.turn.duration": (ship_run, 2),
        "durable.run.duration": ({**ship_run, "status": "completed"}, 1),
        "durable.timers.due": ({"namespace": ""}, 0),
        "durable.timers.oldest_due_age": ({"namespace": ""}, 0),
        "durable.runs.waiting_first_turn": ({"namespace": ""}, 0),
        "durable.steps.oldest_unstarted_age": ({"queue": NOBODY, "namespace": ""}, 0),
    }

    def seen_all():
        points = _worker_points(tmp_path)
        missing = [
            name
            for name, (attributes, least) in expected.items()
            if not any(attributes.items() <= a.items() for a, _ in points.get(name, []))
            or value(points, name, **attributes) < least
        ]
        return points if not missing else None

    points = wait_for(
        seen_all,
        timeout=30,
        what="every instrument in the worker's in-memory readers",
        explain=lambda: f"seen: {sorted(_worker_points(tmp_path))}",
    )
    assert value(points, "durable.steps.attempts", step="tests.e2e_metrics.explode", outcome="failed") == 1
    assert any(a.get("queue") == queue for a, _ in points["durable.step.queue_wait"])

    # The same through the view, in this process: the worker's values from the shared folder.
    settings.DURABLE = {
        **settings.DURABLE,
        "METRICS_TOKEN": TOKEN,
        "METRICS_DIR": str(tmp_path / "prometheus"),
    }

    kinds = {instrument.name: instrument.kind for instrument in INSTRUMENTS}

    def sample_of(name: str) -> str:
        return name.replace(".", "_") + (
            "_total" if kinds[name] == COUNTER else "" if kinds[name] == "gauge" else "_count"
        )

    def scraped_all():
        response = client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200
        found = prometheus_samples(response.content.decode())
        # Each pool process writes its own file about once a second: wait for all of them.
        everything = all(
            value(found, sample_of(name), **attributes) >= least
            for name, (attributes, least) in expected.items()
        )
        return found if everything else None

    scraped = wait_for(scraped_all, timeout=10, what="the worker's files of metrics")
    assert len(list((tmp_path / "prometheus").glob("durable-*.json"))) >= 2  # the pool's, and this one's
    for name, (attributes, least) in expected.items():
        sample = sample_of(name)
        assert any(attributes.items() <= a.items() for a, _ in scraped.get(sample, [])), (
            sample,
            scraped.get(sample),
        )
        assert value(scraped, sample, **attributes) >= least, sample
    assert value(scraped, "durable_steps_oldest_unstarted_age", queue=NOBODY) > 0
    durable.cancel(waiting.id)
    _purge([NOBODY])  # its step's message, which no worker will ever take
