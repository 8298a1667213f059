"""Deploys under every pool: a worker told to stop in the middle of turns and steps fails no run.

Each case starts real runs on a worker of one Celery pool (prefork, threads, solo, gevent), waits
until a body is busy in Python work and a step is running, then stops the worker the way a deploy
does: SIGTERM to the main process (a warm shutdown), SIGTERM to the whole process group (systemd's
``KillMode=control-group``), SIGQUIT (a cold shutdown), or a second signal after the first (an
impatient operator). The worker is then started again: every run completes, none fails or goes
dead, no step attempt runs twice and no step run in place runs again. On the embedded default
(SQLite and the filesystem broker, not for production) only the prefork row runs.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.engine.diagnosis import describe
from durable.models import Run
from durable.testing import settings_env, wait_for
from tests.conftest import on_rabbitmq, on_redis

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEDGER = Path(tempfile.gettempdir()) / "durable-e2e-deploys"
#: Seconds of Python work a body does on each of its turns.
BUSY = 2.0
#: Seconds a step sleeps.
STEP = 2.5
#: Seconds a stopped worker gets to exit before it is killed (systemd's TimeoutStopSec).
STOP_TIMEOUT = 30


@pytest.fixture
def durable_worker_options():
    # The fixture's own worker is not started: each case starts one of the pool it tests.
    # A short lease and quick sweeps, so a turn the shutdown could not hand back is still
    # recovered within the test; the worker's name stays the same across its restart.
    return {
        "start": False,
        "env": settings_env(
            {
                "LEASE": "4s",
                "ORPHAN_SWEEP_INTERVAL": "1s",
                "TIMER_SWEEP_INTERVAL": "1s",
                "RECONCILE_INTERVAL": "5s",
                "STEP_REDISPATCH_AFTER": "3s",
            }
        ),
    }


def _note(run_id: str, event: str) -> None:
    LEDGER.mkdir(exist_ok=True)
    with open(LEDGER / run_id, "a") as f:
        f.write(f"{event}\n")


def ledger(run_id: str) -> list[str]:
    path = LEDGER / run_id
    return path.read_text().split() if path.exists() else []


@durable.step(timeout="30s")
def nap(seconds: float) -> str:
    info = durable.step_info()
    _note(info.run_id, f"step:{info.seq}:{info.attempt}")
    time.sleep(seconds)
    return "rested"


@durable.step(timeout="30s")
def mark(value: str) -> str:
    info = durable.step_info()
    _note(info.run_id, f"mark:{info.seq}:{info.attempt}")
    return value


@durable.step
def in_place(value: str) -> str:
    """No timeout: run in place by the turn, its result written with the turn's settle."""
    info = durable.step_info()
    _note(info.run_id, f"in-place:{info.seq}:{info.attempt}")
    return value


@durable.workflow(name="tests.deploy_busy")
def busy_flow(ctx, seconds):
    """A step run in place, Python work in the body on every turn (no primitive to stop at),
    then a step through the broker."""
    ctx.step(in_place, "first")
    _note(ctx.run_id, "body")
    deadline = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < deadline:
        spins += 1
    return ctx.step(mark, "done")


@durable.workflow(name="tests.deploy_step")
def step_flow(ctx, seconds):
    return [ctx.step(nap, seconds), ctx.step(mark, "after")]


def _twice(entries: list[str], *, in_place_may_rerun: bool = False) -> list[str]:
    """Attempts run twice, and steps run in place run again (their result was there to keep),
    unless ``in_place_may_rerun``: then only an in-place attempt run twice under one number."""
    attempts = [e for e in entries if e.startswith(("step:", "mark:"))]
    if in_place_may_rerun:
        attempts += [e for e in entries if e.startswith("in-place:")]
        again = []
    else:
        again = [e for e in entries if e.startswith("in-place:")][1:]
    return sorted({e for e in attempts if attempts.count(e) > 1} | set(again))


def _busy_and_stepping(runs: list[str]) -> bool:
    return all(any(e == "body" or e.startswith("step:") for e in ledger(r)) for r in runs)


HOWS = {
    # name: (first signal, to the group?, second signal or None)
    "warm": (signal.SIGTERM, False, None),
    "systemd": (signal.SIGTERM, True, None),
    "cold": (signal.SIGQUIT, False, None),
    "second-signal": (signal.SIGINT, False, signal.SIGINT),
}


@pytest.mark.parametrize("how", list(HOWS))
@pytest.mark.parametrize("pool", ["prefork", "threads", "solo", "gevent"])
def test_a_deploy_mid_turn_and_mid_step_fails_no_run_and_runs_no_attempt_twice(durable_worker, pool, how):
    if pool != "prefork" and not (on_redis() or on_rabbitmq()):
        pytest.skip(
            "on the embedded default only the prefork row runs: the other pools are for production brokers"
        )
    if pool == "gevent":
        pytest.importorskip("gevent")
    first, group, second = HOWS[how]
    concurrency = 1 if pool == "solo" else 2
    worker = durable_worker.add_worker(name=f"{pool}-{how}", pool=pool, concurrency=concurrency)
    durable_worker.start_beat()
    runs = [durable.start(busy_flow, BUSY).id, durable.start(step_flow, STEP).id]
    if pool != "solo":
        runs += [durable.start(busy_flow, BUSY).id, durable.start(step_flow, STEP).id]
    # Solo runs one task at a time: the first run's body is busy; the others wait in line.
    started = runs[:1] if pool == "solo" else runs
    wait_for(lambda: _busy_and_stepping(started), 60, what="bodies busy and steps running")
    time.sleep(0.5)

    asked = time.monotonic()
    worker.signal(first, group=group)
    if second is not None:
        time.sleep(0.5)
        worker.signal(second)
    try:
        worker.process.wait_exit(timeout=STOP_TIMEOUT)
        killed = ""
    except subprocess.TimeoutExpired:
        # As systemd does past TimeoutStopSec. Seen on the embedded broker when SIGTERM reaches
        # the pool children: one child ends by the signal while holding the pool's result-queue
        # lock, and its sibling waits for that lock on its way out (billiard).
        worker.kill()
        killed = f", SIGKILLed {STOP_TIMEOUT} s after the signal"
    took = time.monotonic() - asked
    worker.start()
    back = time.monotonic()

    def ended():
        return all(durable.get_run(r).status in ("completed", "failed", "dead", "cancelled") for r in runs)

    wait_for(
        ended,
        90,
        what="every run to end after the restart",
        explain=lambda: f"{describe(runs)}\n{durable_worker.logs()[-6000:]}",
    )
    recovered = time.monotonic() - back
    rows = {r.id: r for r in Run.objects.filter(id__in=runs)}
    failures = {r: (rows[r].status, rows[r].error) for r in runs if rows[r].status != "completed"}
    # A thread cannot be interrupted: a cold shutdown of the threads pool exits under a turn, and
    # a step it ran in place whose result the turn had not written yet runs again, as attempt 2.
    rerun_ok = pool == "threads" and how in ("cold", "second-signal")
    doubled = {r: _twice(ledger(r), in_place_may_rerun=rerun_ok) for r in runs}
    doubled = {r: twice for r, twice in doubled.items() if twice}
    reruns = sum(max(0, len([e for e in ledger(r) if e.startswith("in-place:")]) - 1) for r in runs)
    print(
        f"deploy {pool}/{how}: worker gone {took:.1f} s after the signal{killed}; {len(runs)} runs, ended {recovered:.1f} s after it was back; "
        f"{reruns} step(s) run in place run again"
    )
    assert not failures, f"runs failed by the shutdown: {failures}\n{worker.logs()[-4000:]}"
    assert not doubled, f"attempts run twice: {doubled}"
    if how == "warm":
        assert not killed
        # A warm shutdown waits for the turns and steps in hand: the longest is a step.
        assert took <= STEP + BUSY * 2 + 10, f"the warm shutdown took {took:.1f} s"


@pytest.mark.parametrize(("pool", "multiplier"), [("prefork", 1), ("threads", 1), ("gevent", 4)])
def test_each_pool_prefetches_what_keeps_it_fed(durable_worker, pool, multiplier):
    """The project asks for one message per pool slot (``CELERY_WORKER_PREFETCH_MULTIPLIER = 1``).
    A gevent pool's loop asks the broker for more only at the start of each 2-second poll, so it
    takes Celery's default instead (else a backlog of sweeps hides a run's turns, as seen after a
    cold shutdown here)."""
    if not (on_redis() or on_rabbitmq()):
        pytest.skip("remote control needs a production broker")
    if pool == "gevent":
        pytest.importorskip("gevent")
    from celery import current_app

    worker = durable_worker.add_worker(name=f"fed-{pool}", pool=pool, concurrency=2)

    def prefetch() -> int | None:
        stats = current_app.control.inspect(timeout=2).stats() or {}
        return next((s["prefetch_count"] for node, s in stats.items() if f"fed-{pool}" in node), None)

    assert wait_for(prefetch, 30, interval=1, what=f"{worker} to answer") == 2 * multiplier
