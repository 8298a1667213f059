"""End to end: ``async def`` steps on a real prefork worker, on whatever database and broker the
suite runs on (PostgreSQL + Redis, or the embedded default).

Each pool process awaits its async attempts side by side on its own loop: the Celery task starts
the coroutine and returns, and the outcome is written when it ends. A ledger file per run notes
each start and end of the step's body, outliving any worker.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import pytest
from django.test import override_settings

import durable
from durable.models import Checkpoint
from durable.testing import settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEDGER = Path(tempfile.gettempdir()) / "durable-async-steps-ledger"
# A short lease, so a dead holder is known in seconds; the same in the workers and beat.
SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s", "STEP_TIMEOUT_GRACE": "2s"}


@pytest.fixture
def durable_worker_options():
    return {"start": False, "env": settings_env(SETTINGS)}


@pytest.fixture(autouse=True)
def short_lease():
    with override_settings(DURABLE=SETTINGS):
        yield


def _note(event: str) -> None:
    LEDGER.mkdir(exist_ok=True)
    info = durable.step_info()
    with open(LEDGER / info.run_id, "a") as f:
        f.write(f"{event}:{info.attempt}\n")


def noted(run_id: str) -> list[str]:
    path = LEDGER / run_id
    return path.read_text().split() if path.exists() else []


@durable.step(name="tests.e2e_async.wait")
async def wait(seconds: float) -> str:
    _note("began")
    await asyncio.sleep(seconds)
    _note("ended")
    return f"waited {seconds}"


@durable.step(name="tests.e2e_async.overrun", timeout="1s", retry=durable.Retry(max_attempts=1))
async def overrun() -> str:
    try:
        await asyncio.sleep(30)
    except durable.StepTimeout:
        _note("timed-out")
        raise
    return "never"


@durable.step(name="tests.e2e_async.long", heartbeat_timeout="5s")
async def long(beat: bool) -> str:
    _note("began")
    try:
        for _ in range(300):
            if beat:
                durable.heartbeat({"beating": True})
            await asyncio.sleep(0.2)
    except (asyncio.CancelledError, durable.StepCancelled) as exc:
        _note(f"stopped-by-{type(exc).__name__}")
        raise
    return "never"


@durable.workflow(name="tests.e2e_async.long_flow")
def long_flow(ctx, beat):
    try:
        return ctx.step(long, beat)
    except durable.Cancelled:
        return "cancelled"


@durable.workflow(name="tests.e2e_async.waits")
def waits(ctx, seconds):
    return ctx.step(wait, seconds)


@durable.workflow(name="tests.e2e_async.overruns")
def overruns(ctx, _):
    return ctx.step(overrun)


def test_an_async_step_runs_on_a_real_worker(durable_worker):
    durable_worker.primary.start()
    run = durable.start(waits, 0.1)
    assert durable.result(run.id, timeout=60) == "waited 0.1"
    assert noted(run.id) == ["began:1", "ended:1"]


def test_the_turn_that_reaches_an_async_step_starts_it_without_a_message(durable_worker):
    durable_worker.primary.start()
    run = durable.start(waits, 0.1)
    assert durable.result(run.id, timeout=60) == "waited 0.1"
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    # Taken in the turn's own write (a worker's take, after a message, starts it later).
    assert row.started_at == row.enqueued_at, (row.enqueued_at, row.started_at)


def test_an_async_step_its_turn_took_and_never_started_runs_again(durable_worker):
    # One slot: the first run's step holds it, so the second run's turn commits the take of its
    # step and then waits for the slot to start it. The worker dies in that window.
    durable_worker.start_beat()
    worker = durable_worker.add_worker(
        {"DURABLE_ASYNC_STEPS_PER_PROCESS": "1"}, name="one-slot", concurrency=1
    )
    first = durable.start(waits, 30)
    wait_for(lambda: noted(first.id), timeout=60, what="the first step to start")
    second = durable.start(waits, 0.1)
    taken = Checkpoint.objects.filter(run_id=second.id, seq=0, started_at__isnull=False)
    wait_for(taken.exists, timeout=60, what="the second step to be taken")
    time.sleep(0.5)
    assert noted(second.id) == []  # taken, not started: waiting for the slot
    worker.kill()
    durable_worker.add_worker(name="after")
    assert durable.result(second.id, timeout=90) == "waited 0.1"
    assert noted(second.id) == ["began:2", "ended:2"]  # attempt 1 never began; counted lost
    row = Checkpoint.objects.get(run_id=second.id, seq=0)
    assert (row.status, row.attempt) == ("completed", 2)
    assert durable.cancel(first.id)


def test_an_async_step_is_cancelled_by_its_timeout(durable_worker):
    durable_worker.primary.start()
    run = durable.start(overruns, None)
    began = time.monotonic()
    with pytest.raises(durable.RunFailed, match="ran past its timeout"):
        durable.result(run.id, timeout=60)
    assert time.monotonic() - began < 20
    assert noted(run.id) == ["timed-out:1"]
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (row.status, row.error["type"], row.error["code"]) == ("failed", "StepTimeout", "timeout")


def test_one_process_awaits_many_async_steps_at_once(durable_worker):
    durable_worker.add_worker(name="single", concurrency=1)
    began = time.monotonic()
    runs = [durable.start(waits, 2) for _ in range(20)]
    for run in runs:
        assert durable.result(run.id, timeout=60) == "waited 2"
    took = time.monotonic() - began
    print(f"20 runs of a 2 s async step on one process: {took:.1f}s")
    assert took < 15  # one at a time would take 40 s


def test_a_worker_killed_with_async_steps_in_flight_loses_none(durable_worker):
    durable_worker.start_beat()
    durable_worker.primary.start()
    runs = [durable.start(waits, 4) for _ in range(10)]
    # Every attempt started (their messages acknowledged), none ended: then the worker dies.
    wait_for(lambda: all(noted(run.id) for run in runs), timeout=60, what="every step to start")
    assert not any("ended:1" in noted(run.id) for run in runs)
    durable_worker.kill()
    durable_worker.restart()
    for run in runs:
        assert durable.result(run.id, timeout=90) == "waited 4"
    for run in runs:
        ledger = noted(run.id)
        # The killed attempt ran again once its hold lapsed; each ended once.
        assert ledger.count("began:1") == 1 and ledger[-1] == "ended:2", ledger
        assert [e for e in ledger if e.startswith("ended")] == ["ended:2"], ledger
        row = Checkpoint.objects.get(run_id=run.id, seq=0)
        assert (row.status, row.attempt) == ("completed", 2)


def test_the_bound_of_async_steps_per_process_holds_back_the_rest(durable_worker):
    durable_worker.add_worker({"DURABLE_ASYNC_STEPS_PER_PROCESS": "2"}, name="bounded", concurrency=1)
    began = time.monotonic()
    runs = [durable.start(waits, 1) for _ in range(6)]
    for run in runs:
        assert durable.result(run.id, timeout=60) == "waited 1"
    took = time.monotonic() - began
    print(f"6 runs of a 1 s async step, 2 at a time on one process: {took:.1f}s")
    assert 3 <= took < 20  # two at a time: three waits of a second one after the other


def test_an_interrupting_cancel_stops_async_steps_that_beat_and_that_do_not(durable_worker):
    durable_worker.primary.start()
    beating, silent = durable.start(long_flow, True), durable.start(long_flow, False)
    wait_for(lambda: noted(beating.id) and noted(silent.id), timeout=60, what="both steps to start")
    time.sleep(1)  # the beating one has beaten (its progress saved) by now
    for run in (beating, silent):
        assert durable.cancel(run.id, interrupt=True)
    for run in (beating, silent):
        assert durable.result(run.id, timeout=30) == "cancelled"
        # The body heard of the cancel at its step first (the run ended then): whatever the
        # stopped attempt reports after that is stale.
        assert Checkpoint.objects.get(run_id=run.id, seq=0).status != "completed"
    # Each coroutine hears of it within a second or so: the beating one at a beat (StepCancelled)
    # or at its await (CancelledError), the silent one at its await.
    wait_for(
        lambda: len(noted(beating.id)) == 2 and len(noted(silent.id)) == 2, timeout=10, what="both to stop"
    )
    assert noted(beating.id)[-1] in ("stopped-by-StepCancelled:1", "stopped-by-CancelledError:1")
    assert noted(silent.id) == ["began:1", "stopped-by-CancelledError:1"]
    assert Checkpoint.objects.get(run_id=beating.id, seq=0).progress == {"beating": True}
