"""Remote turns end to end: a workflow's turns replayed by workers that cannot reach the database.

durable's own worker (the ``durable_worker`` fixture, queues ``durable`` and ``celery``) claims
each turn and applies each decision; workers started with a DATABASE_URL nobody listens on
consume only the workflow's queue and replay its body from the turn messages.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from django.test import override_settings

import durable
from durable.models import Checkpoint, Run
from durable.testing import settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TURNS = "rt-e2e-turns"
SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s", "TIMER_SWEEP_INTERVAL": "1s"}
MARKS = Path(os.environ.get("RTE_MARKS") or tempfile.mkdtemp(prefix="durable-rte-"))


def _no_database(name: str, slow: float = 0) -> dict[str, str]:
    return {
        "DATABASE_URL": "postgres://nobody@127.0.0.1:9/nowhere",  # nothing listens on port 9
        "DURABLE_TEST_DATABASE_NAME": "",
        "RTE_MARK": name,
        "RTE_SLOW": str(slow),
        "RTE_MARKS": str(MARKS),
    }


@durable.step(name="tests.rte_double")
def rte_double(x):
    return x * 2


@durable.step(name="tests.rte_slow", local=True)
def rte_slow(x):
    # Runs inside the remote turn, on the remote worker: a long turn, and a place to kill it.
    (MARKS / f"{os.environ.get('RTE_MARK')}-{os.getpid()}").touch()
    time.sleep(float(os.environ.get("RTE_SLOW") or 0))
    return {"x": x, "where": os.environ.get("RTE_MARK")}


@durable.workflow(name="tests.rte_flow", remote=True, queue=TURNS)
def rte_flow(ctx, x):
    doubled = ctx.step(rte_double, x)
    return ctx.step(rte_slow, doubled)


@pytest.fixture
def durable_worker_options():
    return {"env": settings_env(SETTINGS)}


@pytest.fixture(autouse=True)
def short_intervals():
    with override_settings(DURABLE=SETTINGS):
        yield


def test_a_worker_with_no_database_runs_whole_remote_turns(durable_worker):
    remote = durable_worker.add_worker(_no_database("no-database"), name="no-database", queues=[TURNS])
    run = durable.start(rte_flow, 21)
    try:
        result = durable.result(run.id, timeout=60)
    except Exception:
        print(durable_worker.logs()[-8000:])
        raise
    assert result == {"x": 42, "where": "no-database"}
    assert list(Checkpoint.objects.filter(run_id=run.id).values_list("name", "status")) == [
        ("tests.rte_double", "completed"),
        ("tests.rte_slow", "completed"),
    ]
    # The turns were replayed there and applied here: the remote worker never reached a database.
    assert "durable.remote_turn" in remote.logs() and "durable.decision" in durable_worker.primary.logs()


def test_a_remote_worker_killed_mid_turn_has_the_turn_sent_again_elsewhere(durable_worker):
    durable_worker.start_beat()
    first = durable_worker.add_worker(_no_database("first", slow=120), name="first", queues=[TURNS])
    run = durable.start(rte_flow, 5)
    wait_for(lambda: any(MARKS.glob("first-*")), timeout=60, what="the first remote worker mid-turn")
    # Its turn heartbeats keep the lease while it replays, for several times the lease's length
    # and the orphan sweep's interval: the same turn holds it all along.
    turn = Run.objects.get(id=run.id).locked_by
    time.sleep(10)
    held = Run.objects.get(id=run.id)
    assert (held.status, held.locked_by, held.recovery_attempts) == ("running", turn, 0)
    first.kill()
    durable_worker.add_worker(_no_database("second"), name="second", queues=[TURNS])
    try:
        result = durable.result(run.id, timeout=60)
    except Exception:
        print(durable_worker.logs()[-8000:])
        raise
    assert result == {"x": 10, "where": "second"}
    assert Checkpoint.objects.get(run_id=run.id, seq=1).attempt == 1  # the killed turn wrote nothing
