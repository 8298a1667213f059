"""Step-level chaos: processes die mid-step and database connections are cut, steps have no timeout.

Runs of a workflow with dispatched steps that declare no ``timeout``/``heartbeat_timeout`` (the
common case), a local step and a fan of three, all with ``Retry(max_attempts=5)``. The first step
of one run in five ends its process (``os._exit``, as the OOM killer would) the first time it runs.
For a minute, while runs keep starting, a random pool child of a random worker is SIGKILLed every
few seconds (the worker's main process stays, so Celery replaces the child and requeues its
message) and every database connection of the workers and beat is terminated every 15 s.

Then every run must complete with the right output within three minutes of the last fault, with
default settings except LEASE and RECONCILE_INTERVAL (so STEP_REDISPATCH_AFTER is five minutes:
no run may wait for it), and a ledger written by the step bodies (a file per run, which outlives
any process) must show that no attempt of a dispatched step ran twice, that no position ran more
times than its attempts allow, and that a process death counted as a failed attempt.

The workers import this module (``--include``), so the workflow is registered on both sides.
Set DURABLE_CHAOS_SEED to replay the same choices of victims and intervals.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.test import override_settings
from django.utils import timezone

import durable
from durable.models import TERMINAL, Checkpoint, Run
from durable.testing import WorkerHandle, cut_database_connections, settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RUNS = 120
START_SPREAD = 40  # seconds over which the runs are started, so work is in flight all minute
CHAOS_SECONDS = 60
KILL_EVERY = (2.0, 4.0)  # seconds between two pool-child kills, drawn uniformly
CUT_EVERY = 15  # seconds between two cuts of the database connections; the last at CHAOS_SECONDS
CONVERGE_DEADLINE = 180  # seconds after the last fault
MAX_ATTEMPTS = 5
DIES_EVERY = 5  # the first step of run n ends its process on its first execution when n % 5 == 0
# Only these two differ from the defaults, in the test process and (as DURABLE_<KEY>) in the
# workers and beat: recovery is measured against default redispatch and sweep intervals.
SETTINGS = {"LEASE": "3s", "RECONCILE_INTERVAL": "10s"}
LEDGER_ENV = "STEP_CHAOS_LEDGER"
RETRY = durable.Retry(max_attempts=MAX_ATTEMPTS, initial="200ms", maximum="1s")


def _ledger() -> Path:
    return Path(os.environ[LEDGER_ENV])


def _record() -> None:
    """Append this execution to the run's ledger before doing the step's work (one short append:
    a process killed around it leaves the whole line or nothing)."""
    info = durable.step_info()
    with open(_ledger() / info.run_id, "a") as f:
        f.write(f"{info.seq} {info.attempt}\n")


def _die_on_first_execution() -> None:
    """End this process, as the OOM killer would, the first time this run's step gets here."""
    info = durable.step_info()
    try:
        # A symlink is created with its content in one call: a kill cannot leave it empty.
        os.symlink(str(info.attempt), _ledger() / "died" / info.run_id)
    except FileExistsError:
        return
    os._exit(1)


@durable.step(retry=RETRY)
def fetch(n):
    _record()
    if n % DIES_EVERY == 0:
        _die_on_first_execution()
    time.sleep(0.1)
    return n + 1


@durable.step(local=True, retry=RETRY)
def scale(value):
    _record()
    return value * 2


@durable.step(retry=RETRY)
def add_one(value, ms):
    _record()
    time.sleep(ms / 1000)
    return value + 1


@durable.step(retry=RETRY)
def square(value):
    _record()
    time.sleep(0.15)
    return value * value


@durable.workflow(name="tests.step_chaos")
def step_chaos_flow(ctx, n):
    a = ctx.step(fetch, n)
    b = ctx.step(scale, a)
    c = ctx.step(add_one, b, 100)
    fan = ctx.map(square, [c, c + 1, c + 2])
    d = ctx.step(add_one, sum(fan), 50)
    return {"n": n, "c": c, "d": d}


def expected_positions(n: int) -> dict[int, int]:
    """The output of every position of run ``n``."""
    a = n + 1
    c = 2 * a + 1
    fan = [c * c, (c + 1) ** 2, (c + 2) ** 2]
    return {0: a, 1: 2 * a, 2: c, 3: fan[0], 4: fan[1], 5: fan[2], 6: sum(fan) + 1}


def expected_output(n: int) -> dict[str, int]:
    positions = expected_positions(n)
    return {"n": n, "c": positions[2], "d": positions[6]}


DISPATCHED = (0, 2, 3, 4, 5, 6)  # positions 3-5 are the fan; position 1 is the local step
# A local step runs inside its turn and is recorded with it: a turn killed in between runs it
# again as the same attempt, by design. Only dispatched positions have attempts held by a process.
LOCAL = (1,)


@pytest.fixture
def ledger_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="durable-step-chaos-"))
    (path / "died").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def durable_worker_options(ledger_dir, request):
    # No default worker: the test starts two of its own; this env reaches them and beat.
    env = settings_env(BROKER_SETTINGS if request.node.name.startswith(BROKER_TEST) else SETTINGS)
    return {"start": False, "env": {**env, LEDGER_ENV: str(ledger_dir), "DURABLE_LOG_LEVEL": "INFO"}}


class Faults:
    """The chaos: SIGKILL one pool child of a random worker; terminate the workers' connections."""

    def __init__(self, workers: list[WorkerHandle], rng: random.Random) -> None:
        self.workers, self.rng = workers, rng
        self.kills = 0
        self.kill_misses = 0  # a worker caught between a child's death and its replacement
        self.cuts: list[int] = []  # connections terminated, per cut

    def kill_pool_child(self) -> None:
        worker = self.rng.choice(self.workers)
        children = worker.pool_pids()
        if not children or worker.kill_pool_child(self.rng.choice(children)) is None:
            self.kill_misses += 1
            return
        self.kills += 1

    def cut_connections(self) -> None:
        self.cuts.append(cut_database_connections())

    def during(
        self,
        seconds: float,
        kill_every: tuple[float, float],
        spread: float,
        start: Callable[[str], object],
        ids: list[str],
    ) -> int:
        """For ``seconds``: start the runs ``ids`` evenly over ``spread``, SIGKILL a pool child
        every ``kill_every`` (drawn uniformly), cut the connections every CUT_EVERY; return how
        many runs were started."""
        began = time.monotonic()
        started, next_kill, next_cut = 0, began + self.rng.uniform(*kill_every), began + CUT_EVERY
        while (now := time.monotonic()) < began + seconds:
            due = min(len(ids), int(len(ids) * (now - began) / spread) + 1)
            for run_id in ids[started:due]:
                start(run_id)
            started = max(started, due)
            if now >= next_kill:
                self.kill_pool_child()
                next_kill = now + self.rng.uniform(*kill_every)
            if now >= next_cut:
                self.cut_connections()
                next_cut += CUT_EVERY
            time.sleep(0.1)
        return started


def _numbered(prefix: str, count: int, durable_worker) -> tuple[dict[str, int], random.Random]:
    """Run ids of this test (a token of its own) to their numbers, and the chaos's random choices
    (DURABLE_CHAOS_SEED replays them)."""
    seed = int(os.environ.get("DURABLE_CHAOS_SEED") or time.time())
    token = uuid.uuid4().hex[:8]
    print(f"\n{prefix} seed {seed}, runs {prefix}-{token}-*, logs in {durable_worker.workdir}")
    return {f"{prefix}-{token}-{n}": n for n in range(count)}, random.Random(seed)


def _two_workers_and_beat(durable_worker, rng: random.Random) -> Faults:
    workers = [durable_worker.add_worker(name=f"w{i}", wait=False) for i in (1, 2)]
    for worker in workers:
        worker.wait_ready()
    durable_worker.start_beat()
    return Faults(workers, rng)


def read_ledger(path: Path, run_ids: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Every execution the step bodies recorded, as (seq, attempt), per run."""
    executions = {}
    for run_id in run_ids:
        file = path / run_id
        lines = file.read_text().splitlines() if file.exists() else []
        executions[run_id] = [(int(seq), int(attempt)) for seq, attempt in (line.split() for line in lines)]
    return executions


def describe(run_ids: list[str]) -> str:
    lines = []
    for run in Run.objects.filter(id__in=run_ids)[:10]:
        history = list(
            Checkpoint.objects.filter(run=run)
            .order_by("seq")
            .values_list("seq", "status", "attempt", "started_at")
        )
        lines.append(
            f"{run.id} {run.status} wake_at={run.wake_at} locked={run.locked_by} "
            f"recovery={run.recovery_attempts} error={run.error} history={history}"
        )
    return "\n".join(lines)


def summarize_reruns(per_attempt: Counter, per_position: Counter) -> str:
    """What the ledger shows of re-executions of dispatched steps."""
    twice = [count for key, count in per_attempt.items() if count > 1 and key[1] in DISPATCHED]
    most = max((count for key, count in per_position.items() if key[1] in DISPATCHED), default=0)
    return (
        f"re-executions: {len(twice)} attempts of dispatched steps ran more than once (most: "
        f"{max(twice, default=0)} times); most executions of one dispatched position: {most}"
    )


def test_every_run_completes_when_step_processes_die_and_connections_are_cut(
    postgres, server_broker, durable_worker, ledger_dir
):
    began = time.monotonic()
    numbers, rng = _numbered("stepchaos", RUNS, durable_worker)
    ids = list(numbers)
    with override_settings(DURABLE=SETTINGS):
        faults = _two_workers_and_beat(durable_worker, rng)
        workers = faults.workers
        started = faults.during(
            CHAOS_SECONDS,
            KILL_EVERY,
            START_SPREAD,
            lambda run_id: durable.start(step_chaos_flow, numbers[run_id], run_id=run_id),
            ids,
        )
        faults.cut_connections()  # the minute's last cut, and its last fault
        last_fault, last_fault_at = time.monotonic(), timezone.now()
        assert started == RUNS and len(faults.cuts) == CHAOS_SECONDS // CUT_EVERY
        unfinished = Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).count()

        def all_terminal() -> bool:
            return not Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists()

        try:
            wait_for(
                all_terminal, CONVERGE_DEADLINE, interval=0.5, what="every run to end after the last fault"
            )
            converged: float | None = time.monotonic() - last_fault
        except AssertionError:
            converged = None

    runs = {run.id: run for run in Run.objects.filter(id__in=ids)}
    executions = read_ledger(ledger_dir, ids)
    recorded = {
        (run_id, seq): (kind, status, attempt, output)
        for run_id, seq, kind, status, attempt, output in Checkpoint.objects.filter(
            run_id__in=ids
        ).values_list("run_id", "seq", "kind", "status", "attempt", "output")
    }
    died = {path.name: int(os.readlink(path)) for path in (ledger_dir / "died").iterdir()}
    per_attempt = Counter(
        (run_id, seq, attempt) for run_id, done in executions.items() for seq, attempt in done
    )
    per_position = Counter((run_id, seq) for run_id, seq, _ in per_attempt.elements())
    statuses = Counter(run.status for run in runs.values())
    finished = max(filter(None, (run.finished_at for run in runs.values())), default=last_fault_at)
    ended = (
        f"every run ended {converged:.1f} s after the last fault"
        if converged is not None
        else f"runs were left {CONVERGE_DEADLINE} s after the last fault"
    )
    print(
        "\n".join(
            [
                f"runs: {len(runs)} ({unfinished} unfinished at the last fault), by status: {dict(statuses)}",
                f"faults: {faults.kills} pool children SIGKILLed ({faults.kill_misses} times none to kill), "
                f"{len(died)} steps ended their process, connections cut {faults.cuts}",
                f"step executions: {sum(per_attempt.values())} (without faults: {RUNS * (len(DISPATCHED) + len(LOCAL))}), "
                f"max attempt seen: {max((key[2] for key in per_attempt), default=0)} (of {MAX_ATTEMPTS}), "
                f"max attempt recorded: {max((row[2] for row in recorded.values()), default=0)}",
                summarize_reruns(per_attempt, per_position),
                f"convergence: {ended}; the last finished {(finished - last_fault_at).total_seconds():.1f} s after it",
                f"wall time: {time.monotonic() - began:.1f} s",
            ]
        )
    )
    stuck = [run_id for run_id, run in runs.items() if run.status not in TERMINAL]
    assert converged is not None, (
        f"{len(stuck)} runs not ended {CONVERGE_DEADLINE} s after the last fault, e.g.:\n{describe(stuck)}"
    )
    assert all(worker.alive for worker in workers), (
        "a worker's main process died: only pool children were killed"
    )

    not_completed = [run_id for run_id, run in runs.items() if run.status != "completed"]
    assert not not_completed, f"{len(not_completed)} runs did not complete:\n{describe(not_completed)}"
    wrong = [run_id for run_id, run in runs.items() if run.output != expected_output(numbers[run_id])]
    assert not wrong, f"{len(wrong)} runs completed with a wrong output:\n{describe(wrong)}"

    # One completed row per position, holding that position's output: none recorded twice.
    assert len(recorded) == RUNS * len(expected_positions(0))
    bad_rows = [
        (run_id, seq, recorded.get((run_id, seq)))
        for run_id, n in numbers.items()
        for seq, output in expected_positions(n).items()
        if recorded.get((run_id, seq), (None,) * 4)[:2] != ("step", "completed")
        or recorded[run_id, seq][3] != output
    ]
    assert not bad_rows, f"positions not recorded once as completed with their output: {bad_rows[:10]}"

    twice = sorted(key for key, count in per_attempt.items() if count > 1 and key[1] in DISPATCHED)
    assert not twice, (
        f"{len(twice)} attempts of a dispatched step ran more than once (run, seq, attempt): {twice[:10]}"
    )
    beyond = sorted(key for key in per_attempt if key[2] > MAX_ATTEMPTS)
    assert not beyond, f"attempts past Retry(max_attempts={MAX_ATTEMPTS}) ran: {beyond[:10]}"
    too_often = sorted(
        key for key, count in per_position.items() if count > MAX_ATTEMPTS and key[1] in DISPATCHED
    )
    assert not too_often, f"positions executed more than {MAX_ATTEMPTS} times: {too_often[:10]}"
    unbacked = [key for key, row in recorded.items() if (*key, row[2]) not in per_attempt]
    assert not unbacked, f"recorded attempts that never ran: {unbacked[:10]}"
    # A death is a failed attempt (worker_lost): the first step was recorded by a later attempt.
    assert len(died) == len(numbers) // DIES_EVERY
    death_ignored = sorted(run_id for run_id, attempt in died.items() if recorded[run_id, 0][2] <= attempt)
    assert not death_ignored, f"a process death did not count as a failed attempt:\n{describe(death_ignored)}"


# -- every step through the broker --------------------------------------------------------------
# Each result is written with the next turn when that turn only starts the next step (see
# ``engine.result_and_turn``): the same kills and cuts, on runs of consecutive dispatched steps.

BROKER_TEST = "test_every_run_of_dispatched_steps_completes_through_the_broker"
BROKER_SETTINGS = {**SETTINGS, "EAGER_STEPS": False}
CHAINED = 6
BROKER_RUNS = 40
BROKER_CHAOS_SECONDS = 30
BROKER_KILL_EVERY = (1.0, 2.0)


@durable.step(retry=RETRY)
def next_link(value):
    _record()
    info = durable.step_info()
    if info.seq == 2 and value % DIES_EVERY == 0:
        _die_on_first_execution()
    time.sleep(0.02)
    return value + 1


@durable.workflow(name="tests.step_chaos.chained")
def chained_flow(ctx, n):
    value = n
    for _ in range(CHAINED):
        value = ctx.step(next_link, value)
    return value


def test_every_run_of_dispatched_steps_completes_through_the_broker(
    postgres, server_broker, durable_worker, ledger_dir
):
    numbers, rng = _numbered("chained", BROKER_RUNS, durable_worker)
    ids = list(numbers)
    with override_settings(DURABLE=BROKER_SETTINGS):
        faults = _two_workers_and_beat(durable_worker, rng)
        started = faults.during(
            BROKER_CHAOS_SECONDS,
            BROKER_KILL_EVERY,
            BROKER_CHAOS_SECONDS / 2,
            lambda run_id: durable.start(chained_flow, numbers[run_id], run_id=run_id),
            ids,
        )
        assert started == BROKER_RUNS

        def all_terminal() -> bool:
            return not Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists()

        wait_for(all_terminal, CONVERGE_DEADLINE, interval=0.5, what="every run to end after the last fault")

    runs = {run.id: run for run in Run.objects.filter(id__in=ids)}
    print(f"faults: {faults.kills} pool children SIGKILLed, connections cut {faults.cuts}")
    wrong = [
        run_id
        for run_id, run in runs.items()
        if (run.status, run.output) != ("completed", numbers[run_id] + CHAINED)
    ]
    assert not wrong, f"{len(wrong)} runs did not complete with their output:\n{describe(wrong)}"
    recorded = Counter(
        Checkpoint.objects.filter(run_id__in=ids, status="completed").values_list("run_id", flat=True)
    )
    assert all(recorded[run_id] == CHAINED for run_id in ids), "a position missing or recorded twice"
    executions = read_ledger(ledger_dir, ids)
    per_attempt = Counter(
        (run_id, seq, attempt) for run_id, done in executions.items() for seq, attempt in done
    )
    twice = sorted(key for key, count in per_attempt.items() if count > 1)
    assert not twice, f"{len(twice)} attempts ran more than once (run, seq, attempt): {twice[:10]}"
    died = list((ledger_dir / "died").iterdir())
    assert len(died) == BROKER_RUNS // DIES_EVERY
