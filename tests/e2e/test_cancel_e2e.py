"""End to end, on real workers: cleanup in ``finally`` runs once, a cancel delivered into a run
stops its heartbeating step and runs its cleanup, and a dead attempt of a step with a 2 s
``heartbeat_timeout`` is known within that timeout plus its grace (at most a second).

A ledger file per run, written by the steps, tells what ran where.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

import durable
from durable.models import Checkpoint
from durable.testing import settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEDGER = Path(tempfile.gettempdir()) / "durable-cancel-ledger"
# Timers looked at often, so a heartbeat deadline is judged as soon as it passes.
SETTINGS = {"TIMER_SWEEP_INTERVAL": "100ms"}
ONCE = durable.Retry(max_attempts=1)


@pytest.fixture
def durable_worker_options():
    return {"env": settings_env(SETTINGS)}


@pytest.fixture(autouse=True)
def fast_timers():
    with override_settings(DURABLE=SETTINGS):
        yield


def note(event: str) -> None:
    LEDGER.mkdir(exist_ok=True)
    with open(LEDGER / durable.step_info().run_id, "a") as f:
        f.write(f"{event}\n")


def ledger(run_id: str) -> list[str]:
    path = LEDGER / run_id
    return path.read_text().split() if path.exists() else []


# A step under a concurrency limit never runs in place (it may have to wait for a slot): this one
# crosses the broker, as the dispatched case of the reproducer needs.
@durable.step(name="tests.e2e_cancel.a_dispatched", concurrency=10)
def a_dispatched():
    note("a")
    time.sleep(0.3)
    return "a"


@durable.step(name="tests.e2e_cancel.a_in_place")
def a_in_place():
    note("a")
    time.sleep(0.3)
    return "a"


@durable.step(name="tests.e2e_cancel.b")
def b():
    note("b")
    return "b"


@durable.workflow(name="tests.e2e_cancel.reproducer")
def reproducer(ctx, in_place):
    step = a_in_place if in_place else a_dispatched
    try:
        ctx.step(step)
        return ctx.step(step)
    finally:
        ctx.step(b)


@durable.step(name="tests.e2e_cancel.long", heartbeat_timeout="5s", retry=ONCE)
def long():
    note(f"pid:{os.getpid()}")
    try:
        for _ in range(600):
            durable.heartbeat()
            time.sleep(0.1)
    except durable.StepCancelled:
        note("stopped")
        raise
    note("finished")
    return "done"


@durable.step(name="tests.e2e_cancel.cleanup")
def cleanup():
    note("cleanup")
    return "clean"


@durable.workflow(name="tests.e2e_cancel.long_then_cleanup")
def long_then_cleanup(ctx, _):
    try:
        return ctx.step(long)
    finally:
        ctx.step(cleanup)


@durable.step(name="tests.e2e_cancel.beats", heartbeat_timeout="2s", retry=ONCE)
def beats():
    note(f"pid:{os.getpid()}")
    for _ in range(600):
        durable.heartbeat()
        time.sleep(0.1)
    return "done"


@durable.workflow(name="tests.e2e_cancel.beating")
def beating(ctx, _):
    return ctx.all([ctx.defer(beats)])[0]  # a fan: dispatched to a pool child, judged from outside


def _ended(run_id: str, timeout: float):
    return wait_for(
        lambda: (r := durable.get_run(run_id)).status in ("completed", "failed", "dead", "cancelled") and r,
        timeout,
        what=f"run {run_id} to end",
    )


def _pid(run_id: str) -> int:
    found = wait_for(
        lambda: [e for e in ledger(run_id) if e.startswith("pid:")], 30, what="the step to start"
    )
    return int(found[0].split(":")[1])


@pytest.mark.parametrize("in_place", [False, True], ids=["dispatched", "in place"])
def test_the_finally_reproducer_completes_with_a_a_b_on_real_workers(durable_worker, in_place):
    run = durable.start(reproducer, in_place)
    assert durable.result(run.id, timeout=60) == "a"
    names = Checkpoint.objects.filter(run_id=run.id).order_by("seq").values_list("name", flat=True)
    step = "tests.e2e_cancel.a_in_place" if in_place else "tests.e2e_cancel.a_dispatched"
    assert list(names) == [step, step, "tests.e2e_cancel.b"]
    assert ledger(run.id) == ["a", "a", "b"]


def test_a_delivered_cancel_stops_the_heartbeating_step_and_runs_the_cleanup_once(durable_worker):
    run = durable.start(long_then_cleanup)
    _pid(run.id)
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=run.id, seq=0, last_heartbeat_at__isnull=False).exists(),
        30,
        what="the step's first beat",
    )
    assert durable.cancel(run.id, interrupt=True, reason="enough") is True
    ended = _ended(run.id, 60)
    assert ended.status == "cancelled", ended.error
    assert ended.error["message"] == "enough" and ended.error["code"] == "cancelled"
    # The body did not wait for the long step: it stops at its next heartbeat (a second at most).
    step = wait_for(
        lambda: Checkpoint.objects.filter(run_id=run.id, seq=0, status="failed").first(),
        10,
        what="the long step to stop",
    )
    assert (step.error["type"], step.error["code"]) == ("StepCancelled", "cancelled")
    assert sorted(ledger(run.id)[1:]) == ["cleanup", "stopped"]
    kinds = Checkpoint.objects.filter(run_id=run.id).order_by("seq").values_list("kind", flat=True)
    assert list(kinds) == ["step", "cancel", "step"]


def test_a_dead_attempt_is_known_within_its_heartbeat_timeout_plus_the_grace(durable_worker):
    durable_worker.start_beat()
    run = durable.start(beating)
    pid = _pid(run.id)
    time.sleep(1.5)  # beating for a while: several beats persisted
    assert durable_worker.primary.kill_pool_child(pid) == pid
    killed = time.monotonic()
    # Dead: no beat comes after this one (the judge clears it when it fails the attempt).
    last_beat = Checkpoint.objects.get(run_id=run.id, seq=0).last_heartbeat_at
    ended = _ended(run.id, 30)
    noticed = time.monotonic() - killed
    step = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert ended.status == "failed", ended.error
    assert step.error["type"] == "StepTimeout", step.error
    silent = (step.finished_at - last_beat).total_seconds()
    print(f"judged dead {silent:.2f}s after its last persisted beat, {noticed:.2f}s after the kill")
    # heartbeat_timeout 2 s + the grace (0.25 s for it, never over 1 s); the embedded file broker
    # adds its polling (a second) to the timer sweep's message, Redis nothing worth counting; a
    # machine busier than its cores (CI runs ten suites on two) delays beat, the sweep and the
    # worker by up to a second or two more. Without the judge it would be the LEASE: 30 s.
    slack = 0.0 if settings.CELERY_BROKER_URL.startswith("redis") else 1.0
    slack += min(2.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    assert silent <= 3.0 + slack, (silent, slack)
    assert noticed <= 3.5 + slack, (noticed, slack)  # plus the time the test takes to see the end


@durable.step(name="tests.e2e_cancel.elsewhere", queue="e2e-cancel-elsewhere")
def elsewhere():
    note("elsewhere")
    return "done"


@durable.workflow(name="tests.e2e_cancel.elsewhere_then_cleanup")
def elsewhere_then_cleanup(ctx, _):
    try:
        return ctx.step(elsewhere)
    finally:
        ctx.step(cleanup)


def test_a_cancel_that_lands_after_the_awaited_step_ended_still_runs_the_cleanup(durable_worker):
    """The step ends on a worker of its own queue (which runs no turns), the cancel lands while
    no turn runs, then the turns' worker comes back: ``Cancelled`` at the step the run waited on,
    and the cleanup in ``finally`` runs once."""
    run = durable.start(elsewhere_then_cleanup)
    # The turn that sends the step published it once its task returns: stopped before, the
    # message would wait for the sweep that sends it again.
    wait_for(
        lambda: (
            "durable.advance" in durable_worker.primary.logs()
            and "succeeded" in durable_worker.primary.logs()
        ),
        30,
        what="the step to be sent",
    )
    durable_worker.primary.stop()  # no turn runs from here
    steps = durable_worker.add_worker(name="steps", queues=["e2e-cancel-elsewhere"])
    wait_for(
        lambda: Checkpoint.objects.get(run_id=run.id, seq=0).status == "completed",
        30,
        what="the step to end",
        explain=lambda: f"{list(Checkpoint.objects.filter(run_id=run.id).values())}\n{steps.logs()[-3000:]}",
    )
    steps.stop()
    assert durable.cancel(run.id, interrupt=True, reason="too late") is True
    durable_worker.primary.start()
    record = _ended(run.id, 60)
    assert record.status == "cancelled"
    assert ledger(run.id) == ["elsewhere", "cleanup"]
    kinds = list(Checkpoint.objects.filter(run_id=run.id).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["step", "cancel", "step"]
