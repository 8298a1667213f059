"""The servers themselves restart: PostgreSQL (a minor upgrade, a failover) and Redis.

Each test starts a server of its own on a free port (never the shared 5432 / 6379), a real
worker and beat on it, and a batch of runs with steps (one run in place, a fan through the
broker) and timers. In the middle of the batch the server restarts (PostgreSQL: ``pg_ctl
restart -m fast``, or stopped for 20 s; Redis: stopped and started again, every message in it
lost). The worker and beat are never restarted: they must reconnect by themselves, and once the
server is back no run may wait longer than two RECONCILE_INTERVALs for its next move (a lost
message is repaired by the next reconcile sweep; the run's own steps and timers then take what
they take on a machine as loaded as CI's). The step bodies write a ledger
(a file per run, one line per execution) that must show no attempt ran twice.

The worker imports this module (``--include``), so the workflow is registered on both sides.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count, Max
from django.test import override_settings
from django.utils import timezone

import durable
from durable.engine.diagnosis import describe
from durable.models import TERMINAL, Checkpoint, Run
from durable.testing import DurableWorker, settings_env, wait_for
from tests.e2e.conftest import servers_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Only these differ from the defaults, here and (as DURABLE_<KEY>) in the worker and beat: the
# lease and the orphan sweep keep their production ratio (30 s, 5 s) to the reconcile interval.
SETTINGS = {"LEASE": "3s", "RECONCILE_INTERVAL": "10s", "ORPHAN_SWEEP_INTERVAL": "2s"}
RECONCILE = timedelta(seconds=10)
RUNS = 16
OUTAGE = 20  # seconds the PostgreSQL server stays down in the outage test
LEDGER_ENV = "DURABLE_RESTARTS_LEDGER"


def _record() -> None:
    """Append this execution to its run's ledger before the step's work (one short append)."""
    info = durable.step_info()
    with open(Path(os.environ[LEDGER_ENV]) / info.run_id, "a") as f:
        f.write(f"{info.seq} {info.attempt}\n")


@durable.step
def inc(n: int) -> int:
    _record()
    time.sleep(0.1)
    return n + 1


@durable.workflow(name="tests.server_restarts")
def restarts_flow(ctx, n):
    a = ctx.step(inc, n)  # run in place by the turn (EAGER_STEPS)
    ctx.sleep("1s")
    fan = ctx.map(inc, [a, a + 1])  # a fan's members always cross the broker
    ctx.sleep("1s")
    return ctx.step(inc, sum(fan))


def expected(n: int) -> int:
    return 2 * n + 6


@pytest.fixture(autouse=True)
def short_intervals() -> Iterator[None]:
    with override_settings(DURABLE=SETTINGS):
        yield


@pytest.fixture
def durable_worker_options(request: pytest.FixtureRequest, ledger: Path) -> dict:
    return {"env": {**settings_env(SETTINGS), LEDGER_ENV: str(ledger), **servers_env(request)}}


def start_batch() -> dict[str, int]:
    return {durable.start(restarts_flow, n).id: n for n in range(RUNS)}


def wait_until_mid_batch(ids: dict[str, int]) -> str:
    """Until some steps are recorded, one is running and no run has ended; say what is in flight."""
    steps = Checkpoint.objects.filter(run_id__in=ids, kind="step")

    def in_flight() -> bool:
        done = steps.filter(status="completed").count()
        return done >= RUNS // 2 and steps.filter(status="pending", started_at__isnull=False).exists()

    wait_for(in_flight, 60, interval=0.05, what="steps of the batch to be recorded while one runs")
    assert not Run.objects.filter(id__in=ids, status__in=TERMINAL).exists(), "the batch ended too soon"
    running = steps.filter(status="pending", started_at__isnull=False).count()
    sent = steps.filter(status="pending", started_at__isnull=True).count()
    timers = Checkpoint.objects.filter(run_id__in=ids, kind="sleep", status="pending").count()
    return f"{running} steps running, {sent} sent and not taken, {timers} timers pending"


def wait_for_batch_end(ids: dict[str, int], worker: DurableWorker) -> None:
    wait_for(
        lambda: not Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists(),
        90,
        interval=0.25,
        what="every run of the batch to end",
        explain=lambda: f"{describe(list(ids))}\n{worker.logs()[-8000:]}",
    )


def check_batch(ids: dict[str, int], ledger: Path, back: datetime, what: str, flight: str) -> None:
    """Every run completed with its output, no attempt ran twice, each position recorded once,
    and no run stood still longer than two reconcile intervals after ``back``."""
    runs = {run.id: run for run in Run.objects.filter(id__in=ids)}
    ended = sum(run.status == "completed" for run in runs.values())
    last = max(run.finished_at for run in runs.values() if run.finished_at)
    executions = Counter(
        (path.name, line) for path in ledger.iterdir() for line in path.read_text().splitlines()
    )
    twice = [key for key, count in executions.items() if count > 1]
    positions = Checkpoint.objects.filter(run_id__in=ids).values("run_id", "seq").annotate(n=Count("id"))
    recorded_twice = [row for row in positions if row["n"] > 1]
    lost = Checkpoint.objects.filter(run_id__in=ids).aggregate(attempts=Max("attempt"))["attempts"]
    stalls = {run_id: longest_stall(run, back) for run_id, run in runs.items()}
    worst = max(stalls, key=stalls.__getitem__)
    print(
        f"\n{what} ({flight}): {ended}/{len(ids)} runs ended, {len(twice)} attempts run twice, "
        f"{len(recorded_twice)} positions recorded twice, {sum(executions.values())} executions for "
        f"{len(ids) * 4} positions (highest attempt {lost}); last run ended "
        f"{(last - back).total_seconds():.2f} s after the server was back, the longest standstill "
        f"{stalls[worst].total_seconds():.2f} s"
    )
    assert {run_id: (run.status, run.output) for run_id, run in runs.items()} == {
        run_id: ("completed", expected(n)) for run_id, n in ids.items()
    }
    assert not twice, f"attempts executed twice: {twice}"
    assert not recorded_twice
    assert stalls[worst] <= 2 * RECONCILE, timeline(runs[worst], back)


def moments(run: Run) -> list[datetime]:
    """Every moment ``run`` moved: created, each position sent, started, due and ended, it ended."""
    found = [run.created_at, run.finished_at]
    for c in Checkpoint.objects.filter(run_id=run.id):
        found += [c.enqueued_at, c.started_at, c.wake_at, c.finished_at]
    return sorted(moment for moment in found if moment)


def longest_stall(run: Run, back: datetime) -> timedelta:
    """The longest time after ``back`` in which ``run`` did not move (a timer's due time is a move:
    waiting for it is not standing still)."""
    after = [back] + [moment for moment in moments(run) if moment > back]
    return max((b - a for a, b in pairwise(after)), default=timedelta(0))


def timeline(run: Run, back: datetime) -> str:
    """The positions of ``run``, in seconds from ``back``: where its time went."""

    def at(moment: datetime | None) -> str:
        return f"{(moment - back).total_seconds():+.2f}" if moment else "-"

    lines = [f"the run that stood still longest, started {at(run.created_at)}, ended {at(run.finished_at)}:"]
    for c in Checkpoint.objects.filter(run_id=run.id).order_by("seq"):
        lines.append(
            f"  {c.seq} {c.kind} attempt {c.attempt}: sent {at(c.enqueued_at)} started {at(c.started_at)} "
            f"due {at(c.wake_at)} ended {at(c.finished_at)}"
        )
    return "\n".join(lines)


def restart_postgres(server, worker, ledger, what: str) -> None:
    worker.start_beat()
    ids = start_batch()
    flight = wait_until_mid_batch(ids)
    server.restart()
    back = timezone.now()
    connection.close()  # this process's connection died with the server too
    wait_for_batch_end(ids, worker)
    check_batch(ids, ledger, back, what, flight)


def postgres_outage(server, worker, ledger, what: str) -> None:
    worker.start_beat()
    ids = start_batch()
    flight = wait_until_mid_batch(ids)
    server.stop()
    time.sleep(OUTAGE)
    server.start()
    back = timezone.now()
    connection.close()
    wait_for_batch_end(ids, worker)
    check_batch(ids, ledger, back, f"{what} down {OUTAGE} s", flight)


def test_no_run_stands_still_two_reconcile_intervals_after_a_postgres_restart(
    postgres_server, durable_worker, ledger
):
    restart_postgres(postgres_server, durable_worker, ledger, "PostgreSQL restart")


def test_no_run_stands_still_two_reconcile_intervals_after_a_postgres_outage_of_twenty_seconds(
    postgres_server, durable_worker, ledger
):
    postgres_outage(postgres_server, durable_worker, ledger, "PostgreSQL")


# Behind PgBouncer in transaction mode the worker's connections to PgBouncer outlive the server:
# a restart breaks only the server connections, and PgBouncer makes new ones for the next
# transaction; through the outage, a transaction waits in PgBouncer's queue for a server.
def test_behind_pgbouncer_no_run_stands_still_after_a_postgres_restart(
    postgres_server, pgbouncer, durable_worker, ledger
):
    restart_postgres(postgres_server, durable_worker, ledger, "PostgreSQL restart behind PgBouncer")


def test_behind_pgbouncer_no_run_stands_still_after_a_postgres_outage(
    postgres_server, pgbouncer, durable_worker, ledger
):
    postgres_outage(postgres_server, durable_worker, ledger, "PostgreSQL behind PgBouncer")


def test_no_run_stands_still_two_reconcile_intervals_after_a_redis_restart(
    postgres, redis_server, durable_worker, ledger
):
    """On PostgreSQL, as in production (the embedded default's SQLite is not run with Redis)."""
    durable_worker.start_beat()
    ids = start_batch()
    flight = wait_until_mid_batch(ids)
    redis_server.restart()
    back = timezone.now()
    wait_for_batch_end(ids, durable_worker)
    check_batch(ids, ledger, back, "Redis restart", flight)


def test_the_worker_and_beat_outlive_redis_restarts_in_a_row(postgres, redis_server, durable_worker, ledger):
    """Redis restarted eight times, at moments a seeded random picks, each under a batch of runs
    of its own: Celery's reconnect closes a connection whose transport kombu closed first, which
    made the worker exit in about one restart of six (durable/redis_restarts.py)."""
    seed = int(os.environ.get("DURABLE_RESTARTS_SEED", random.randrange(1 << 16)))
    print(f"\nDURABLE_RESTARTS_SEED={seed}")
    chosen = random.Random(seed)
    durable_worker.start_beat()
    ids: dict[str, int] = {}
    for _ in range(8):
        ids |= {durable.start(restarts_flow, n).id: n for n in range(4)}
        time.sleep(chosen.uniform(0.2, 2.5))
        redis_server.restart()
        time.sleep(chosen.uniform(0, 1))
        down = [process for process in durable_worker.workers + durable_worker.beats if not process.alive]
        assert not down, f"{down} exited after a Redis restart:\n{durable_worker.logs()[-8000:]}"
    back = timezone.now()
    wait_for_batch_end(ids, durable_worker)
    check_batch(ids, ledger, back, "eight Redis restarts", "batches of four")
