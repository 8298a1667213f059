"""Async Django views end to end: the example project served by a real ASGI server (uvicorn)
in a subprocess, called over HTTP. One view starts a run with ``durable.astart`` and awaits
``aresult``, another streams a run's values as server-sent events with ``aread_stream``, while a
real ``celery worker`` runs the workflows, on the configured broker and database."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

import durable
from durable.models import Run
from durable.processes import CeleryProcess
from project.shop.workflows import STAGES, track
from tests.e2e.servers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ORDER = {"id": 31, "items": [{"sku": "mug", "qty": 2, "cents": 450}, {"sku": "tea", "qty": 1, "cents": 300}]}


@pytest.fixture
def asgi_server(durable_worker) -> Iterator[str]:
    """``uvicorn project.asgi:application`` on a free port, on the worker's database and broker;
    its base URL."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "project.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--lifespan",
        "off",  # Django speaks HTTP only
    ]
    server = CeleryProcess(
        argv, durable_worker.env, durable_worker.workdir / "uvicorn.log", "Uvicorn running on"
    )
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


def test_an_async_view_starts_a_run_and_awaits_its_result_from_a_worker(asgi_server, durable_worker):
    status, answer = _post(f"{asgi_server}/shop/quote/", ORDER)
    assert status == 200, answer
    assert answer["order"] == 31 and answer["cents"] == 1200
    run = Run.objects.get(id=answer["run_id"])
    assert (run.workflow, run.status) == ("shop.quote", "completed")
    assert durable.result(run.id) == {"order": 31, "cents": 1200}


def test_an_async_view_streams_a_runs_values_as_server_sent_events_while_it_runs(asgi_server, durable_worker):
    durable_worker.start_beat()
    run = durable.start(track, 12)
    began = time.monotonic()
    events: list[tuple[str, dict, float]] = []
    with urllib.request.urlopen(f"{asgi_server}/shop/track/{run.id}/events", timeout=60) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        name = "message"
        for raw in response:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: ")), time.monotonic() - began))
                if name == "end":
                    break
                name = "message"
    stages = [value["stage"] for name, value, _ in events if name == "message"]
    assert stages == [*STAGES, "done"] and events[-1][0] == "end"
    # Live: the first scan came a second or more before the last (the parcel travels in between).
    assert events[-1][2] - events[0][2] >= len(STAGES) - 1
    assert durable.result(run.id, timeout=30) == [f"12:{stage}" for stage in STAGES]
