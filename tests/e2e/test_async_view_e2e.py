"""An async Django view end to end: the example project served by a real ASGI server (uvicorn)
in a subprocess, called over HTTP; its view starts a run with ``durable.astart`` and awaits
``aresult`` while a real ``celery worker`` runs the workflow, on the configured broker and
database."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator

import pytest

import durable
from durable.models import Run
from durable.processes import CeleryProcess
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
