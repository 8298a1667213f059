"""End to end: workflow bodies that would hold a worker forever, on a real worker of one process.

A body looping without primitives is stopped at TURN_TIME_LIMIT (one that swallows the stop is
abandoned, its pool process replaced); a cancel stops a running turn; the worker serves on.
"""

# ruff: noqa: SIM105  (the bodies under test swallow exceptions on purpose)

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.models import Checkpoint
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TICKS = Path(tempfile.gettempdir()) / "durable-e2e-bodies"
SHORT = {"DURABLE_TURN_TIME_LIMIT": "2s", "DURABLE_MAX_RECOVERY_ATTEMPTS": "1"}
LONG = {"DURABLE_TURN_TIME_LIMIT": "10m"}
SWEEPS = {"DURABLE_ORPHAN_SWEEP_INTERVAL": "1s", "DURABLE_TIMER_SWEEP_INTERVAL": "0.5s"}


@pytest.fixture
def durable_worker_options():
    # Each test starts its own single-process worker: a turn stuck in it would stop everything.
    return {"start": False, "env": {"DURABLE_LEASE": "3s"}}


def ticks(run_id: str) -> int:
    path = TICKS / run_id
    return len(path.read_text().split()) if path.exists() else 0


def tick(run_id: str, i: int) -> None:
    TICKS.mkdir(exist_ok=True)
    with open(TICKS / run_id, "a") as f:
        f.write(f"{i}\n")
    time.sleep(0.2)


@durable.workflow(name="tests.e2e_bodies.ticks")
def ticking(ctx, _):
    # Work in the body between primitives that write nothing until the turn ends (ctx.now), so
    # no fenced write stops the turn: only the primitive asking whether the turn must stop.
    for i in range(10_000):
        ctx.now()
        if not ctx.is_replaying:
            tick(ctx.run_id, i)


@durable.workflow(name="tests.e2e_bodies.spins")
def spinning(ctx, swallow):
    ctx.now()
    if not ctx.is_replaying:
        tick(ctx.run_id, 0)  # it spins now (a first turn replayed ahead leaves its run pending)
    while True:
        if not swallow:
            continue
        try:
            while True:
                pass
        except BaseException:  # noqa: BLE001 - swallows even the keeper's stop
            pass


@durable.step(name="tests.e2e_bodies.noted")
def noted(run_id):
    """A step of no time, run in place (no timeout, on a worker of its queue): it notes each run."""
    TICKS.mkdir(exist_ok=True)
    with open(TICKS / f"{run_id}.step", "a") as f:
        f.write("ran\n")
    return "noted"


@durable.workflow(name="tests.e2e_bodies.sleeps")
def sleeping(ctx, seconds):
    ctx.step(noted, ctx.run_id)
    time.sleep(seconds)  # plain Python, no primitive: only the keeper can stop it
    return "woke"


@durable.workflow(name="tests.e2e_bodies.quick")
def quick(ctx, value):
    return value


def serves_on(worker_logs: str = "") -> None:
    assert durable.result(durable.start(quick, "still serving").id, timeout=30) == "still serving", (
        worker_logs
    )


@pytest.mark.parametrize("swallow", [False, True], ids=["loops", "loops-and-swallows"])
def test_a_body_looping_without_primitives_ends_dead_at_turn_time_limit(durable_worker, swallow):
    worker = durable_worker.add_worker(SHORT, concurrency=1)
    began = time.monotonic()
    run = durable.start(spinning, swallow)
    record = wait_for(
        lambda: (r := durable.get_run(run.id)).status == "dead" and r, 60, 0.2, "the run to go dead"
    )
    print(
        f"bodies: a spinning body ({'swallowing' if swallow else 'plain'}) went dead after two turns "
        f"of TURN_TIME_LIMIT 2s in {time.monotonic() - began:.1f} s"
    )
    assert record.error["details"]["cause"] == "turn_time_limit", record.error
    assert "TURN_TIME_LIMIT" in record.error["message"]
    serves_on(worker.logs())
    assert ("ending this pool process" in worker.logs()) is swallow


def test_cancel_stops_a_running_turn_at_its_next_primitive(durable_worker):
    worker = durable_worker.add_worker(LONG, concurrency=1)
    run = durable.start(ticking)
    wait_for(lambda: ticks(run.id) >= 3, 30, what="the turn to tick")
    assert durable.cancel(run.id)
    cancelled_at = ticks(run.id)
    time.sleep(3)
    after = ticks(run.id)
    time.sleep(2)
    print(f"bodies: {after - cancelled_at} tick(s) of 0.2 s ran after cancel(), then none")
    assert after - cancelled_at <= 10, worker.logs()  # about a second: the keeper checks once a second
    assert ticks(run.id) == after
    assert durable.get_run(run.id).status == "cancelled"
    serves_on(worker.logs())


def test_cancel_stops_a_turn_that_never_calls_a_primitive(durable_worker):
    worker = durable_worker.add_worker(LONG, concurrency=1)
    run = durable.start(spinning, False)
    wait_for(lambda: ticks(run.id) >= 1, 30, what="the turn to run")
    time.sleep(0.5)
    assert durable.cancel(run.id)
    began = time.monotonic()
    serves_on(worker.logs())  # one process: it is free again only once the spinning turn stopped
    print(
        f"bodies: a spinning turn stopped and the worker served the next run {time.monotonic() - began:.1f} s "
        "after cancel()"
    )
    assert durable.get_run(run.id).status == "cancelled"
    assert "stopping the turn of run" in worker.logs()


@pytest.mark.parametrize("seconds", [4, 30], ids=["stopped-when-it-wakes", "abandoned"])
def test_a_body_sleeping_past_turn_time_limit_after_a_step_in_place_names_the_limit(durable_worker, seconds):
    """The step's result, held for the turn's next write, is written when the turn is stopped or
    abandoned: the step ran once and completed, and the run's end names TURN_TIME_LIMIT."""
    worker = durable_worker.add_worker(SHORT, concurrency=1)
    durable_worker.start_beat({**SHORT, **SWEEPS})  # the lost turns and attempts are found by sweeps
    run = durable.start(sleeping, seconds)
    try:
        record = wait_for(
            lambda: (r := durable.get_run(run.id)).status in ("dead", "failed", "completed") and r,
            120,
            0.2,
            "the run to end",
        )
    except AssertionError:
        print(worker.logs()[-6000:])
        raise
    steps = Checkpoint.objects.filter(run_id=run.id, kind="step")
    assert list(steps.values_list("status", "attempt")) == [("completed", 1)], (
        record.error,
        worker.logs()[-3000:],
    )
    assert (TICKS / f"{run.id}.step").read_text().split() == ["ran"]
    assert "TURN_TIME_LIMIT" in record.error["message"], record.error
    assert record.error["details"]["cause"] == "turn_time_limit", record.error
