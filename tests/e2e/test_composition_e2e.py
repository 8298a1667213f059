"""Composition end to end on real workers: a big fan, a child tree with a saga, a compensating
cancel of a running step, and a plain Celery task used as a step."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
from celery import shared_task
from django.conf import settings

import durable
from durable.models import Checkpoint, Run
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEDGER = Path(tempfile.gettempdir()) / "durable-e2e-composition"


@pytest.fixture
def durable_worker_options():
    # Short leases so a crash-looping grandchild goes dead within seconds.
    return {
        "env": {
            "DURABLE_LEASE": "2s",
            "DURABLE_MAX_RECOVERY_ATTEMPTS": "1",
            "DURABLE_ORPHAN_SWEEP_INTERVAL": "1s",
        }
    }


def events(key: str) -> list[str]:
    path = LEDGER / key
    return path.read_text().split() if path.exists() else []


def log(key: str, event: str) -> None:
    LEDGER.mkdir(exist_ok=True)
    with open(LEDGER / key, "a") as f:
        f.write(f"{event}\n")


@durable.step
def noop(i):
    return i


@durable.workflow(name="tests.e2e_fan")
def fan_flow(ctx, n):
    return sum(ctx.map(noop, list(range(n))))


@durable.step
def reserve(key):
    log(key, "reserve")
    return f"r-{key}"


@reserve.compensation
def release(reservation, key):
    log(key, f"release:{reservation}")


@durable.step(local=True)
def die():
    os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies mid-turn, every time


@durable.workflow(name="tests.e2e_grandchild")
def grandchild_flow(ctx, _):
    return ctx.step(die)


@durable.workflow(name="tests.e2e_middle")
def middle_flow(ctx, _):
    return ctx.child(grandchild_flow)


@durable.workflow(name="tests.e2e_root")
def root_flow(ctx, key):
    ctx.step(reserve, key)
    return ctx.child(middle_flow)


@durable.step(timeout="30s")
def slow_reserve(key):
    log(key, "slow-start")
    time.sleep(3)
    log(key, "slow-end")
    return f"s-{key}"


@slow_reserve.compensation
def slow_release(reservation, key):
    log(key, f"release:{reservation}")


@durable.workflow(name="tests.e2e_cancel_running")
def cancel_running_flow(ctx, key):
    ctx.step(slow_reserve, key)
    return ctx.wait_for_signal("never")


@shared_task(name="tests.e2e_legacy_multiply")
def legacy_multiply(a, b):
    return a * b


@durable.workflow(name="tests.e2e_legacy")
def legacy_flow(ctx, n):
    return ctx.step(legacy_multiply, n, 7)


def test_fan_of_dispatched_steps_completes(durable_worker):
    size = 1000 if settings.CELERY_BROKER_URL.startswith("redis") else 200
    started = time.monotonic()
    run = durable.start(fan_flow, size)
    assert durable.result(run.id, timeout=240) == size * (size - 1) // 2
    print(f"fan of {size} dispatched steps: {time.monotonic() - started:.1f} s")
    assert Checkpoint.objects.filter(run_id=run.id, status="completed").count() == size


def test_a_fan_wider_than_one_insert_completes(durable_worker, postgres):
    """3,000 positions of 25 columns are past PostgreSQL's 65,535 parameters a statement: the
    first turn writes them in slices (one INSERT of them all crashed every retry of the turn)."""
    size = 3000
    started = time.monotonic()
    run = durable.start(fan_flow, size)
    assert durable.result(run.id, timeout=150) == size * (size - 1) // 2
    print(f"fan of {size} dispatched steps: {time.monotonic() - started:.1f} s")
    assert Run.objects.get(id=run.id).recovery_attempts == 0


def test_grandchild_dies_and_the_roots_saga_compensates(durable_worker):
    durable_worker.start_beat()
    key = f"tree-{time.time_ns()}"
    run = durable.start(root_flow, key)
    with pytest.raises(durable.RunFailed) as failure:
        durable.result(run.id, timeout=120)
    assert failure.value.code == "max_recovery_attempts"
    middle = Run.objects.get(parent_id=run.id)
    grandchild = Run.objects.get(parent_id=middle.id)
    assert (grandchild.status, middle.status) == ("dead", "failed")
    assert events(key) == ["reserve", f"release:r-{key}"]


def test_compensating_cancel_while_a_step_runs(durable_worker):
    durable_worker.start_beat()
    key = f"cancel-{time.time_ns()}"
    run = durable.start(cancel_running_flow, key)
    wait_for(lambda: "slow-start" in events(key), 60, what="the step to start")
    assert durable.cancel(run.id, compensate=True, reason="changed my mind") is True
    with pytest.raises(durable.RunCancelled):
        durable.result(run.id, timeout=60)
    # The step finished after the cancel and was compensated all the same.
    assert events(key) == ["slow-start", "slow-end", f"release:s-{key}"]


def test_plain_celery_shared_task_as_a_step(durable_worker):
    run = durable.start(legacy_flow, 6)
    assert durable.result(run.id, timeout=60) == 42
    step = Checkpoint.objects.get(run_id=run.id)
    assert (step.name, step.status, step.started_at is not None) == (
        "tests.e2e_legacy_multiply",
        "completed",
        True,
    )
