"""End to end: an ``async def`` body on a real worker, killed mid-turn and replayed; Temporal's
hello samples written as async bodies on the same worker."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.models import Checkpoint
from durable.testing import wait_for
from tests.integration.test_hello_async import greeting_parent, greeting_workflow, say_hello_workflow

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MARKS = Path(tempfile.gettempdir()) / "durable-e2e-async-bodies"
SWEEPS = {"DURABLE_ORPHAN_SWEEP_INTERVAL": "1s", "DURABLE_TIMER_SWEEP_INTERVAL": "0.5s"}


@pytest.fixture
def durable_worker_options():
    # Restarted under the same INSTANCE_ID, the worker takes the killed turn's run back at once.
    return {"env": {"DURABLE_INSTANCE_ID": "async-bodies-e2e-w1", **SWEEPS}}


def ledger(run_id: str) -> list[str]:
    path = MARKS / run_id
    return path.read_text().split("\n")[:-1] if path.exists() else []


def note(run_id: str, line: str) -> None:
    MARKS.mkdir(exist_ok=True)
    with open(MARKS / run_id, "a") as f:
        f.write(f"{line}\n")


@durable.step(name="tests.e2e_async_bodies.part")
def part(run_id: str, i: int) -> int:
    note(run_id, f"part {i}")
    return i * 10


@durable.step(name="tests.e2e_async_bodies.hang", local=True)
def hang_the_first_time(run_id: str) -> str:
    note(run_id, "hang")
    if ledger(run_id).count("hang") == 1:
        time.sleep(60)  # the worker is killed here, mid-turn, holding the run's lease
    return "resumed"


@durable.workflow(name="tests.e2e_async_bodies.flow")
async def flow(ctx, _) -> list:
    parts = await asyncio.gather(*(ctx.step(part, ctx.run_id, i) for i in range(3)))
    await ctx.sleep("1s")
    go = await ctx.wait_for_signal("go")
    return [list(parts), go, await ctx.step(hang_the_first_time, ctx.run_id)]


def test_an_async_body_killed_mid_turn_replays_and_records_each_step_once(durable_worker):
    durable_worker.start_beat(SWEEPS)
    run = durable.start(flow)
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=run.id, kind="signal").exists(), 60, what="the signal's wait"
    )
    durable.signal(run.id, "go", "went")
    wait_for(lambda: "hang" in ledger(run.id), 60, what="the turn to run the local step")
    durable_worker.kill()
    durable_worker.restart()
    try:
        assert durable.result(run.id, timeout=60) == [[0, 10, 20], "went", "resumed"]
    except Exception:
        print(durable_worker.logs()[-6000:])
        raise
    assert sorted(line for line in ledger(run.id) if line.startswith("part")) == [
        "part 0",
        "part 1",
        "part 2",
    ]
    assert ledger(run.id).count("hang") == 2  # a local step's attempt died with its turn: run again
    rows = Checkpoint.objects.filter(run_id=run.id).order_by("seq").values_list("kind", "fan", "status")
    assert list(rows) == [
        ("step", 0, "completed"),
        ("step", 0, "completed"),
        ("step", 0, "completed"),
        ("sleep", None, "completed"),
        ("signal", None, "completed"),
        ("step", None, "completed"),
    ]


def test_temporal_hello_samples_as_async_bodies_on_a_real_worker(durable_worker):
    assert durable.result(durable.start(greeting_workflow, "World").id, timeout=60) == "Hello, World!"
    assert durable.result(durable.start(say_hello_workflow).id, timeout=60) == [
        f"Hello, user{i}!" for i in range(1, 5)
    ]
    assert durable.result(durable.start(greeting_parent, "World").id, timeout=60) == "Hello, World!"
