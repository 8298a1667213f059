"""A step that ignores its soft time limit on a real worker: at the hard limit durable records
the attempt's outcome ``timeout`` first, then ends the pool process, so the run retries at once
instead of after the liveness window (a LEASE). In place (inside the turn), dispatched and
``local=True`` alike.

The worker imports this module (``--include``), so the workflow is registered on both sides.
"""

from __future__ import annotations

import contextlib
import os
import time

import pytest

import durable
from durable.models import Checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# The default LEASE (30 s) is the window a dead attempt would otherwise take to be noticed.
GRACE = "1s"


def _stubborn() -> dict:
    info = durable.step_info()
    if info.attempt == 1:
        durable.heartbeat(progress={"pid": os.getpid()})  # a first beat is written at once
        while True:  # swallows StepTimeout and every other interruption: only the hard limit ends it
            with contextlib.suppress(BaseException):
                time.sleep(0.2)
    row = Checkpoint.objects.get(run_id=info.run_id, seq=info.seq)
    return {"before": row.error, "first_pid": row.progress["pid"], "pid": os.getpid()}


LIMITS = {"timeout": "1s", "retry": durable.Retry(max_attempts=2, initial="100ms")}
stubborn = durable.step(name="tests.time_limits_e2e.stubborn", **LIMITS)(_stubborn)
stubborn_local = durable.step(name="tests.time_limits_e2e.stubborn_local", local=True, **LIMITS)(_stubborn)


@durable.workflow(name="tests.time_limits_e2e.stubborn")
def stubborn_flow(ctx, local):
    return ctx.step(stubborn_local if local else stubborn)


@pytest.fixture(params=["in place", "dispatched", "local"])
def where(request):
    return request.param


@pytest.fixture
def durable_worker_options(where):
    eager = "1" if where == "in place" else "0"
    return {"env": {"DURABLE_STEP_TIMEOUT_GRACE": GRACE, "DURABLE_EAGER_STEPS": eager}}


def test_the_hard_limit_records_timeout_before_the_process_ends_and_the_run_retries(where, durable_worker):
    durable_worker.start_beat()
    began = time.monotonic()
    run = durable.start(stubborn_flow, where == "local")
    output = durable.result(run.id, timeout=60)
    took = time.monotonic() - began
    print(f"retried after the hard limit in {took:.1f}s")
    assert output["before"]["code"] == "timeout", output
    # The watchdog's write at the hard limit, or, on a loaded machine, the timer sweep judging the
    # same deadline a moment earlier (then the watchdog's guarded write finds it decided): either
    # way the outcome is ``timeout`` and the process was ended (checked below).
    said = output["before"]["message"]
    assert "did not stop within" in said or "gave no result or heartbeat in time" in said, said
    # Known at the hard limit (1 s + 1 s), not after a LEASE (30 s) of silence.
    assert took < 20
    step = Checkpoint.objects.get(run_id=run.id)
    assert (step.enqueued_at is None) == (where != "dispatched"), "not where the test meant it to run"
    # The process that ran the first attempt was ended (the pool started another).
    assert output["first_pid"] != output["pid"]
    assert not _running(output["first_pid"])


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a process that ended and awaits its parent's reaping does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
