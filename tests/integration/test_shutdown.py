"""A turn or a step interrupted by its worker's shutdown is handed back, not failed.

The worker's probe (durable.celery) recognises Celery's own shutdown: its state after a cold
shutdown began, gevent's GreenletExit, and a prefork child's SystemExit from billiard's handler.
"""

from __future__ import annotations

import sys
import types

import pytest
from django.db import connection

import durable
from durable import celery as wiring
from durable import conf
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

LEAVE: list[BaseException] = []


@durable.step
def record(value):
    return value


@durable.step(local=True)
def interrupted_in_place(value):
    if LEAVE:
        raise LEAVE.pop()
    return value


@durable.workflow(name="tests.shutdown_body")
def body_flow(ctx, _):
    if LEAVE:
        raise LEAVE.pop()
    return ctx.step(record, "done")


@durable.workflow(name="tests.shutdown_bug")
def buggy_flow(ctx, _):
    raise NotImplementedError("a real bug")


RECORDED: list[str] = []


@durable.step
def counted(value):
    RECORDED.append(value)
    return value


@durable.workflow(name="tests.shutdown_after_a_step")
def after_a_step_flow(ctx, _):
    first = ctx.step(counted, "one")
    if LEAVE:
        raise LEAVE.pop()
    return ctx.step(counted, f"{first} two")


@durable.workflow(name="tests.shutdown_in_place")
def in_place_flow(ctx, _):
    return ctx.step(interrupted_in_place, "done")


class ColdShutdown:
    def __init__(self, monkeypatch):
        from celery.worker import state

        self.state, self.monkeypatch = state, monkeypatch
        monkeypatch.setattr(state, "should_terminate", 1)

    def over(self):
        """The worker was started again."""
        self.monkeypatch.setattr(self.state, "should_terminate", None)


@pytest.fixture
def cold_shutdown(monkeypatch):
    yield ColdShutdown(monkeypatch)
    LEAVE.clear()


def test_a_first_turn_interrupted_by_a_cold_shutdown_is_sent_again_and_completes_later(
    durable_env, cold_shutdown
):
    run = durable.start(body_flow)
    LEAVE.append(NotImplementedError("solo TaskPool does not implement kill_job"))
    with pytest.raises(NotImplementedError):
        durable_env.run_next()
    row = Run.objects.get(id=run.id)
    # Replayed ahead of any claim (PostgreSQL), nothing of it was written: still to begin.
    begun = "pending" if connection.vendor == "postgresql" else "suspended"
    assert (row.status, row.locked_by, row.error, row.recovery_attempts) == (begun, None, None, 0)
    assert row.wake_at <= durable_env.now() + conf.get().LEASE
    assert [m.task for m in durable_env.pending()] == ["durable.advance"]  # its turn, sent again
    cold_shutdown.over()
    durable_env.run_until_idle()
    assert durable.result(run.id) == "done"


def test_a_result_whose_next_turn_is_interrupted_by_a_cold_shutdown_is_recorded_once(
    durable_env, cold_shutdown
):
    RECORDED.clear()
    run = durable.start(after_a_step_flow)
    durable_env.run_next()  # the first turn: the step is sent
    LEAVE.append(NotImplementedError("solo TaskPool does not implement kill_job"))
    # The step runs, and the shutdown comes while its run's next turn is replayed (with the
    # result, on PostgreSQL; after it, as a turn, elsewhere).
    with pytest.raises(NotImplementedError):
        durable_env.run_next()
    first = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (first.status, first.output, first.attempt) == ("completed", "one", 1)
    assert "durable.advance" in [m.task for m in durable_env.pending()]  # its next turn, sent
    cold_shutdown.over()
    durable_env.run_until_idle()
    assert durable.result(run.id) == "one two"
    assert RECORDED == ["one", "one two"]  # the first step was not run again


def test_a_local_step_interrupted_by_a_shutdown_is_not_failed_and_runs_again(durable_env, cold_shutdown):
    run = durable.start(in_place_flow)
    LEAVE.append(SystemExit(-241))
    with pytest.raises(SystemExit):
        durable_env.run_next()
    assert Run.objects.get(id=run.id).status == "suspended"
    assert not Checkpoint.objects.filter(run_id=run.id, status="failed").exists()
    cold_shutdown.over()
    durable_env.run_until_idle()
    assert durable.result(run.id) == "done"


def test_the_same_exception_outside_a_shutdown_fails_the_run(durable_env):
    run = durable.start(buggy_flow)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "failed"


def test_the_worker_probe_knows_celerys_ways_of_leaving(monkeypatch):
    from celery.exceptions import WorkerShutdown, WorkerTerminate
    from celery.worker import state

    assert wiring._worker_leaving(WorkerShutdown()) and wiring._worker_leaving(WorkerTerminate(1))
    assert not wiring._worker_leaving(SystemExit(-241))  # sys.exit() in a body is the body's
    assert not wiring._worker_leaving(RuntimeError())
    greenlet = types.ModuleType("greenlet")
    greenlet.GreenletExit = type("GreenletExit", (BaseException,), {})
    monkeypatch.setitem(sys.modules, "greenlet", greenlet)
    assert wiring._worker_leaving(greenlet.GreenletExit())
    billiard = types.ModuleType("billiard.common")
    billiard._should_have_exited = [True]  # billiard's SIGTERM handler ran in this pool child
    monkeypatch.setitem(sys.modules, "billiard.common", billiard)
    assert wiring._worker_leaving(SystemExit(-241))
    monkeypatch.setattr(state, "should_terminate", 1)
    assert wiring._worker_leaving(RuntimeError("raised by a cold shutdown's signal handler"))
