"""A worker restarted under the same INSTANCE_ID takes its predecessor's runs back at once."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MARKS = Path(tempfile.gettempdir()) / "durable-e2e-restart"


@pytest.fixture
def durable_worker_options():
    # No beat: only the restarted worker's own reclaim can bring the run back before the
    # 30 s lease would run out.
    return {"env": {"DURABLE_INSTANCE_ID": "restart-test-w1"}}


def starts(run_id: str) -> list[float]:
    path = MARKS / run_id
    return [float(line) for line in path.read_text().split()] if path.exists() else []


@durable.step(local=True)
def hang_the_first_time(run_id: str) -> str:
    MARKS.mkdir(exist_ok=True)
    with open(MARKS / run_id, "a") as f:
        f.write(f"{time.time()}\n")
    if len(starts(run_id)) == 1:
        time.sleep(60)  # the worker is killed here, mid-turn, holding the run's lease
    return "resumed"


@durable.workflow(name="tests.e2e_restart")
def restart_flow(ctx, _):
    return ctx.step(hang_the_first_time, ctx.run_id)


def test_restarted_worker_with_the_same_instance_id_resumes_within_two_seconds(durable_worker):
    run = durable.start(restart_flow)
    wait_for(lambda: len(starts(run.id)) == 1, 60, what="the first turn to start")
    assert durable.get_run(run.id).locked_by.startswith("restart-test-w1/")
    durable_worker.kill()
    asked = time.time()
    durable_worker.restart()
    ready = time.time()
    assert durable.result(run.id, timeout=20) == "resumed"
    resumed = starts(run.id)[1]
    print(
        f"restart: run resumed {resumed - asked:.2f} s after the restart began, worker boot "
        f"included ({max(resumed - ready, 0):.2f} s after it was seen ready; the lease is 30 s)"
    )
    assert resumed - ready <= 2.0
    assert durable.get_run(run.id).recovery_attempts == 0  # reset by the turn that completed
