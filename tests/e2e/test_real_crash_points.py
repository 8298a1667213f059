"""The crash-point explorer's "process death" (tests/crashpoints.py) checked against a real one:
a Celery pool process SIGKILLs itself at a chosen point of the same kinds (an SQL statement before
it runs, a commit before and after, a publish before and after; tests/e2e/real_crash.py), in a
workflow with a step in place, a local step and a fan through the broker, three runs at once.
After it, the same invariants as the explorer's hold: every run ends with the fault-free output,
no step attempt ran twice (a local step's once more at most), no attempt ran beyond the one
recorded, every recorded result was produced by its attempt, nothing is left held or leased, and
every history replays."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

import durable
from durable.models import Checkpoint, Run
from durable.testing import settings_env, wait_for
from tests.conftest import _skip_or_fail, on_postgres
from tests.crashpoints import run_problems, step_problems
from tests.e2e import real_crash
from tests.e2e.conftest import settings_fixtures

real_crash.arm_from_environment()

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s", "RECONCILE_INTERVAL": "5s"}
_, short_lease = settings_fixtures(SETTINGS)
LEDGER = Path(tempfile.gettempdir()) / "durable-real-crash-ledger"


@pytest.fixture
def durable_worker_options():
    return {"env": settings_env(SETTINGS), "start": False}  # the armed worker is the only one


def effect() -> None:
    """A step's side effect, noted outside the database: a death does not take it back."""
    info = durable.step_info()
    with open(LEDGER / info.run_id, "a") as ledger:
        ledger.write(f"{info.seq} {info.attempt}\n")


@durable.step(name="tests.real_crash.add")
def add(i: int) -> int:
    effect()
    return i + 1


@durable.step(name="tests.real_crash.local", local=True)
def local_add(i: int) -> int:
    effect()
    return i + 1


@durable.workflow(name="tests.real_crash.flow")
def flow(ctx, n):
    first = ctx.step(add, n)  # in place
    second = ctx.step(local_add, first)
    return [first, second, ctx.map(add, [first, second, n])]  # members through the broker


#: (what the point's description contains, which of its kind in the dying process): a turn's
#: claim, its write of new positions, its commit (before and after), its sends (before and after),
#: a worker's take of a fan member, the member's result, its count on the fan, the run's wake
#: once the fan is done, and the write that ends the run. (``real_crash.arm(needle, 0, path)``
#: lists a run's points.)
POINTS = [
    ('UPDATE "durable_run" SET recovery_attempts', 1),
    ('INSERT INTO "durable_checkpoint"', 1),
    ("before commit", 1),
    ("after commit", 1),
    ("before publish", 1),
    ("after publish", 2),
    ("WITH taken", 1),
    ('UPDATE "durable_checkpoint" SET "status" = %s, "output"', 1),
    ('UPDATE "durable_fan"', 1),
    ('UPDATE "durable_run" SET wakes', 1),
    ('UPDATE "durable_run" SET "status" = %s, "output"', 1),
]


@pytest.mark.parametrize(("needle", "n"), POINTS, ids=[f"{needle} #{n}" for needle, n in POINTS])
def test_a_worker_process_killed_at_a_crash_point_leaves_the_invariants_whole(
    durable_worker, tmp_path, needle, n
):
    if not on_postgres():
        _skip_or_fail("the real twin of the explorer runs on PostgreSQL: set DATABASE_URL=postgres://...")
    LEDGER.mkdir(exist_ok=True)
    marker = tmp_path / "struck"
    armed = durable_worker.add_worker(real_crash.arm(needle, n, marker), name="armed")
    durable_worker.start_beat()
    inputs = [0, 10, 20]
    runs = [durable.start(flow, i) for i in inputs]
    wait_for(lambda: real_crash.struck(marker) is not None, 60, what=f"the death at {needle} #{n}")
    pid, point = real_crash.struck(marker)
    wait_for(lambda: pid not in armed.pool_pids(), 10, what="the pool process to be gone")
    for run, i in zip(runs, inputs, strict=True):
        assert durable.result(run.id, timeout=90) == _fault_free(i)
    problems = [problem for run in runs for problem in _violations(run.id)]
    assert not problems, f"killed at {point}: {problems}"


def _fault_free(n: int) -> list:
    first, second = n + 1, n + 2
    return [first, second, [first + 1, second + 1, n + 1]]


def _violations(run_id: str) -> list[str]:
    ran: dict[tuple[int, int], int] = {}
    path = LEDGER / run_id
    for line in path.read_text().splitlines() if path.exists() else []:
        seq, attempt = map(int, line.split())
        ran[seq, attempt] = ran.get((seq, attempt), 0) + 1
    found, again = [], 0
    for position in Checkpoint.objects.filter(run_id=run_id, kind="step"):
        problems, extra = step_problems(position, {a: n for (s, a), n in ran.items() if s == position.seq})
        found += problems
        again += extra
        if position.held_by is not None:
            found.append(f"{position}: still held by {position.held_by}")
    if again > 1:
        found.append(f"the local step ran {again} extra times for one death")
    return found + run_problems(Run.objects.get(id=run_id))


def teardown_module() -> None:
    for path in LEDGER.glob("*"):
        os.unlink(path)
