"""A process that starts runs and dies before its publishing thread sent their first turns (here:
its broker stalls, answering nothing, and it is SIGKILLed) loses no run: each run carries its
``wake_at``, and the timer sweep sends the first turn when it falls due. Its ``start()`` calls
return meanwhile, though the broker answers nothing.

The worker imports this module (``--include``), and so does the starting process.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

import durable
from durable.models import Checkpoint, Run
from durable.testing import wait_for
from tests.e2e.conftest import settings_fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SETTINGS = {"RECONCILE_INTERVAL": "4s"}
RECONCILE = timedelta(seconds=4)
RUNS = 5


@durable.step
def square(n: int) -> int:
    return n * n


@durable.workflow(name="tests.starter_killed.square")
def square_flow(ctx, n):
    return ctx.step(square, n)


durable_worker_options, short_reconcile = settings_fixtures(SETTINGS)

STARTER = f"""
import contextlib, json, sys, time
import django
django.setup()
from django.db import transaction
import durable
from {__name__} import square_flow
ids, slowest = [], 0.0
for n in range({RUNS}):
    began = time.monotonic()
    # as a view under ATOMIC_REQUESTS, or a script's loop
    with transaction.atomic() if sys.argv[1] == "atomic" else contextlib.nullcontext():
        ids.append(durable.start(square_flow, n).id)
    slowest = max(slowest, time.monotonic() - began)
print(json.dumps({{"ids": ids, "slowest": slowest}}), flush=True)
time.sleep(600)
"""


@pytest.fixture
def stalled_broker() -> Iterator[str]:
    """A Redis URL whose server takes connections and never answers (a broker that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        listener.close()


@pytest.mark.parametrize("how", ["alone", "atomic"])
def test_runs_whose_starter_died_before_publishing_are_turned_by_the_timer_sweep(
    how, redis_broker, durable_worker, stalled_broker
):
    durable_worker.start_beat()
    env = {**durable_worker.env, "CELERY_BROKER_URL": stalled_broker}
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, how],
        env=env,
        cwd=os.getcwd(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        ready, _, _ = select.select([starter.stdout], [], [], 60)
        assert ready, "the starter's start() calls did not return within 60 s: they waited for the broker"
        line = starter.stdout.readline()
        assert line, "the starter exited before printing its runs"
        started = json.loads(line)
    finally:
        starter.send_signal(signal.SIGKILL)  # before its thread could publish: the broker never answered
        starter.wait(30)
    ids = started["ids"]
    assert len(ids) == RUNS
    assert started["slowest"] < 2.0, "start() waited for the stalled broker"
    wait_for(
        lambda: Run.objects.filter(id__in=ids, status="completed").count() == RUNS,
        60,
        interval=0.2,
        what="every run to complete after its starter died",
    )
    for n, run_id in enumerate(ids):
        run = Run.objects.get(id=run_id)
        assert durable.result(run_id) == n * n
        # Nothing left the dead process: the first turn came from the sweep, once due.
        assert run.started_at - run.created_at >= RECONCILE - timedelta(seconds=0.5)
        assert Checkpoint.objects.filter(run_id=run_id, kind="step").count() == 1
    print(
        "first turns",
        sorted(
            round((r.started_at - r.created_at).total_seconds(), 2) for r in Run.objects.filter(id__in=ids)
        ),
        "s after the starts; slowest start",
        round(started["slowest"], 4),
        "s",
    )
