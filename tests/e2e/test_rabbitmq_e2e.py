"""RabbitMQ's own faults: it drops the workers' connections, and it redelivers a message whose
consumer held it unacknowledged too long.

- A batch of runs with dispatched steps, a fan and a timer, while every connection to the suite's
  vhost is closed twice (``rabbitmqctl close_connection``, as a broker restart, a failover or a
  load balancer's idle cut would): every run completes, every step is recorded once, no attempt
  runs twice, and the same worker processes consume again without a restart.
- A step still running when its channel goes (RabbitMQ's ``consumer_timeout``, 30 minutes by
  default, closes the channel of a consumer that holds a message unacknowledged for longer; this
  RabbitMQ cannot set it per queue, so the test closes the connection, which redelivers the
  message the same way): the redelivered message finds the attempt started and held by the
  process still running it, so it runs nothing, and the attempt ends once, recorded once.

The workers import this module (``--include``), so the workflows are registered on both sides.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

import durable
from durable.models import TERMINAL, Checkpoint, Run
from durable.testing import DurableWorker, settings_env, wait_for
from tests import rabbitmq

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEDGER_ENV = "RABBITMQ_E2E_LEDGER"
RUNS = 60  # before the drops; LATE_RUNS more are started after them
LATE_RUNS = 20
HOPS = 3
CONVERGE_DEADLINE = 120  # seconds after the last drop
# Short intervals, so whatever a dropped publish left converges in seconds; every step through
# the broker (none run inside its turn), so every attempt is a message RabbitMQ delivers.
SETTINGS = {"LEASE": "3s", "RECONCILE_INTERVAL": "10s", "ORPHAN_SWEEP_INTERVAL": "1s", "EAGER_STEPS": False}
RETRY = durable.Retry(max_attempts=5, initial="200ms", maximum="1s")
HOLD_AT_MOST = 60  # seconds the long step waits for the test to release it


def _ledger() -> Path:
    return Path(os.environ[LEDGER_ENV])


def _record() -> None:
    """Append this execution to the run's ledger (a file, so it outlives any process)."""
    info = durable.step_info()
    with open(_ledger() / info.run_id, "a") as f:
        f.write(f"{info.seq} {info.attempt}\n")


@durable.step(retry=RETRY)
def hop(value, i):
    _record()
    time.sleep(0.1)
    return value + i


@durable.step(retry=RETRY)
def square(value):
    _record()
    time.sleep(0.1)
    return value * value


@durable.workflow(name="tests.rabbitmq_drop")
def drop_flow(ctx, n):
    total = n
    for i in range(HOPS):
        total = ctx.step(hop, total, i)
    ctx.sleep("1s")
    fan = ctx.map(square, [total, total + 1])
    return sum(fan)


def expected(n: int) -> int:
    total = n + sum(range(HOPS))
    return total * total + (total + 1) ** 2


@durable.step
def long_step(tag):
    """Outlives its delivery: holds until the test touches ``release`` (or HOLD_AT_MOST)."""
    _record()
    deadline = time.monotonic() + HOLD_AT_MOST
    while not (_ledger() / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"done": tag}


@durable.workflow(name="tests.rabbitmq_long_step")
def long_flow(ctx, tag):
    return ctx.step(long_step, tag)


@pytest.fixture
def ledger_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="durable-rabbitmq-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def durable_worker_options(ledger_dir):
    return {"env": {**settings_env(SETTINGS), LEDGER_ENV: str(ledger_dir), "DURABLE_LOG_LEVEL": "INFO"}}


def executions(ledger: Path, ids: list[str]) -> Counter[tuple[str, int, int]]:
    """How many times each (run, position, attempt) ran, from the ledger."""
    ran: Counter[tuple[str, int, int]] = Counter()
    for rid in ids:
        path = ledger / rid
        for line in path.read_text().splitlines() if path.exists() else []:
            seq, attempt = line.split()
            ran[rid, int(seq), int(attempt)] += 1
    return ran


def drop_when(ids: list[str], completed_steps: int) -> int:
    """Once ``completed_steps`` step positions of ``ids`` are recorded, close every connection
    to the vhost (the workers', beat's and this process's); return how many were closed."""
    wait_for(
        lambda: (
            Checkpoint.objects.filter(run_id__in=ids, kind="step", status="completed").count()
            >= completed_steps
        ),
        90,
        what=f"{completed_steps} steps recorded before the drop",
    )
    return rabbitmq.close_connections("durable test: connection drop")


def worker_pids(worker: DurableWorker) -> list[int]:
    return [handle.process.proc.pid for handle in worker.workers if handle.process.proc is not None]


def test_every_run_ends_once_when_rabbitmq_drops_every_connection(
    rabbitmq_broker, postgres, durable_worker, ledger_dir
):
    began = time.monotonic()
    token = uuid.uuid4().hex[:8]
    with override_settings(DURABLE=SETTINGS):
        durable_worker.add_worker({"DURABLE_INSTANCE_ID": "rabbit-w2"}, name="w2")
        durable_worker.start_beat()
        pids = worker_pids(durable_worker)
        numbers = {f"drop-{token}-{n}": n for n in range(RUNS)}
        for run_id, n in numbers.items():
            durable.start(drop_flow, n, run_id=run_id)
        ids = list(numbers)
        per_run = HOPS + 2
        drops = [drop_when(ids, RUNS * per_run // 4), drop_when(ids, RUNS * per_run // 2)]
        dropped_at = time.monotonic()
        # The workers reconnect by themselves: runs started after the drops complete too.
        late = {f"drop-{token}-late-{n}": RUNS + n for n in range(LATE_RUNS)}
        for run_id, n in late.items():
            durable.start(drop_flow, n, run_id=run_id)
        numbers.update(late)
        ids = list(numbers)

        wait_for(
            lambda: not Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists(),
            CONVERGE_DEADLINE,
            interval=0.5,
            what="every run to end after the connection drops",
        )
        converged = time.monotonic() - dropped_at

    runs = {run.id: run for run in Run.objects.filter(id__in=ids)}
    ended = sum(run.status in TERMINAL for run in runs.values())
    wrong = {
        rid: (run.status, run.output) for rid, run in runs.items() if run.output != expected(numbers[rid])
    }
    assert not wrong, f"runs that did not complete with their output: {list(wrong.items())[:5]}"
    recorded = Counter(
        Checkpoint.objects.filter(run_id__in=ids, kind="step", status="completed").values_list(
            "run_id", flat=True
        )
    )
    assert all(recorded[rid] == per_run for rid in ids), "a step position recorded other than once"
    ran = executions(ledger_dir, ids)
    twice = {key: n for key, n in ran.items() if n > 1}
    assert not twice, f"attempts run twice: {twice}"
    assert all(d >= 2 for d in drops), f"the drops closed too few connections: {drops}"
    assert worker_pids(durable_worker) == pids and all(w.restarts == 0 for w in durable_worker.workers)
    print(
        f"\nrabbitmq drop: runs ended {ended}/{len(ids)}, attempts run twice {len(twice)}, "
        f"step executions {sum(ran.values())} (without faults: {len(ids) * per_run}), "
        f"connections closed {drops}, last run ended {converged:.1f} s after the last drop, "
        f"wall time {time.monotonic() - began:.1f} s"
    )


def test_a_step_outliving_its_delivery_runs_once_and_stays_held(
    rabbitmq_broker, postgres, durable_worker, ledger_dir
):
    run_id = durable.start(long_flow, "x").id
    started = wait_for(
        lambda: Checkpoint.objects.filter(run_id=run_id, kind="step", held_by__isnull=False).first(),
        60,
        what="the long step to start",
    )
    assert rabbitmq.close_connections("durable test: as consumer_timeout closes a channel") >= 1

    # The message comes back (unacknowledged when its channel went) and the reconnected worker
    # takes it: it finds the attempt started and held, and runs nothing.
    def redelivered_and_refused() -> bool:
        log = durable_worker.logs()
        return "durable.run_step" in log and "'stale'" in log

    wait_for(redelivered_and_refused, 60, what="the redelivered run_step to be refused as stale")
    held = Checkpoint.objects.get(pk=started.pk)
    assert (held.status, held.attempt, held.held_by) == ("pending", 1, started.held_by)
    # Still renewed by the process running it (LEASE is 3 s here).
    wait_for(
        lambda: Checkpoint.objects.get(pk=started.pk).held_until > held.held_until,
        10,
        what="the hold renewed",
    )

    (ledger_dir / "release").touch()
    assert durable.result(run_id, timeout=60) == {"done": "x"}
    row = Checkpoint.objects.get(pk=started.pk)
    assert (row.status, row.attempt) == ("completed", 1)
    assert executions(ledger_dir, [run_id]) == {(run_id, 0, 1): 1}
