"""A step that runs through a PostgreSQL outage longer than a lease is not judged lost.

Its process lives and goes on renewing its hold; only the database did not answer. Once the
server is back, the orphan sweep must not count the attempt as dead before its holder had a
chance to renew it: the step then runs once, and its one attempt is recorded. The lease keeps its
production ratio to the orphan sweep (30 s against 5 s; here 15 s against 2 s), so the sweep
passes several times in the lease's last third, when the holder renews.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

import durable
from durable.models import Checkpoint, Run
from durable.testing import settings_env, wait_for
from tests.e2e.conftest import servers_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SETTINGS = {"LEASE": "15s", "RECONCILE_INTERVAL": "20s", "ORPHAN_SWEEP_INTERVAL": "2s"}
OUTAGE = 20  # seconds: longer than the lease
STEP_SECONDS = 35  # the step runs before, through and after the outage
LEDGER_ENV = "DURABLE_OUTAGE_LEDGER"


@durable.step(timeout="2m")
def long_step(n: int) -> int:
    info = durable.step_info()
    with open(Path(os.environ[LEDGER_ENV]) / info.run_id, "a") as f:
        f.write(f"{info.seq} {info.attempt}\n")
    time.sleep(STEP_SECONDS)
    return n + 1


@durable.workflow(name="tests.outage_holds")
def outage_flow(ctx, n):
    return ctx.step(long_step, n)


@pytest.fixture(autouse=True)
def lease() -> Iterator[None]:
    with override_settings(DURABLE=SETTINGS):
        yield


@pytest.fixture
def durable_worker_options(request: pytest.FixtureRequest, ledger: Path) -> dict:
    return {"env": {**settings_env(SETTINGS), LEDGER_ENV: str(ledger), **servers_env(request)}}


def test_a_step_running_through_an_outage_longer_than_its_lease_runs_once(
    postgres_server, durable_worker, ledger
):
    durable_worker.start_beat()
    run_id = durable.start(outage_flow, 1).id
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=run_id, started_at__isnull=False).exists(),
        60,
        what="the step to start",
    )
    postgres_server.stop()
    time.sleep(OUTAGE)
    postgres_server.start()
    connection.close()
    wait_for(
        lambda: Run.objects.get(id=run_id).status == "completed", 90, interval=0.5, what="the run to end"
    )
    executions = (ledger / run_id).read_text().split("\n")[:-1]
    step = Checkpoint.objects.get(run_id=run_id, kind="step")
    print(f"\nstep through a {OUTAGE} s outage: executions {executions}, recorded attempt {step.attempt}")
    assert executions == ["0 1"], "the live attempt was judged lost and the step ran again"
    assert step.attempt == 1
    assert durable.get_run(run_id).output == 2
