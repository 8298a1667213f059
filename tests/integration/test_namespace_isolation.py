"""A worker with DURABLE["NAMESPACE"] does no work of another namespace, whatever message reaches it.

A misrouted or forged message (``durable.advance`` of another tenant's run on this tenant's queue)
is refused and logged: nothing changes, the run's lease and its attempts are not consumed, and
the run stays intact for its own workers.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

import durable
from durable import dispatch
from durable.engine import decisions, entity_ops, results_by_message, steps, turn, wake_batches
from durable.models import Checkpoint, EntityOp, EntityPrompt, Run

pytestmark = pytest.mark.django_db

OURS, THEIRS = "ta", "tb"


def _as(namespace: str | None):
    """This process as a worker of ``namespace``."""
    return override_settings(DURABLE={"NAMESPACE": namespace})


@durable.step(name="tests.iso_step")
def iso_step(n):
    return n + 1


@durable.workflow(name="tests.iso_flow")
def iso_flow(ctx, n):
    return ctx.step(iso_step, n)


@durable.step(name="tests.iso_remote", remote=True, queue="iso-gpu")
def iso_remote(n):
    return n * 2


@durable.workflow(name="tests.iso_remote_flow")
def iso_remote_flow(ctx, n):
    return ctx.step(iso_remote, n)


@durable.workflow(name="tests.iso_remote_turns", remote=True, queue="iso-turns")
def iso_remote_turns(ctx, n):
    return ctx.step(iso_step, n)


@durable.entity("tests.iso_counter")
class Counter:
    def initial_state(self):
        return {"total": 0}

    def add(self, state, n):
        state["total"] += n
        return state["total"]


def _untouched(run_id: str) -> None:
    run = Run.objects.get(id=run_id)
    assert (run.status, run.locked_by, run.started_at, run.recovery_attempts) == ("pending", None, None, 0)
    assert not Checkpoint.objects.filter(run_id=run_id).exists()


def _theirs(durable_env, workflow=iso_flow, arg=1) -> str:
    run_id = durable.start(workflow, arg, namespace=THEIRS).id
    durable_env.drop()  # the message is delivered by hand, to the wrong worker
    return run_id


def test_advance_of_another_namespace_is_refused(durable_env):
    run_id = _theirs(durable_env)
    with _as(OURS):
        assert turn.advance(run_id) == "foreign"
    _untouched(run_id)
    assert not durable_env.pending()
    with _as(THEIRS):
        turn.advance(run_id)
        durable_env.run_until_idle()
    assert durable.result(run_id) == 2


def test_advance_batch_of_another_namespace_is_refused(durable_env):
    run_id = _theirs(durable_env)
    with _as(OURS):
        assert wake_batches.advance_batch([run_id]) == ["foreign"]
    _untouched(run_id)
    assert not durable_env.pending()


def test_a_worker_in_no_namespace_serves_every_namespace(durable_env):
    run_id = _theirs(durable_env)
    with _as(None):
        turn.advance(run_id)
        durable_env.run_until_idle()
    assert durable.result(run_id) == 2


def test_a_remote_turn_of_another_namespace_is_neither_claimed_nor_applied(durable_env):
    run_id = _theirs(durable_env, iso_remote_turns)
    with _as(OURS):
        assert turn.advance(run_id) == "foreign"
    _untouched(run_id)
    with _as(THEIRS):
        turn.advance(run_id)
        (sent,) = durable_env.drop(dispatch.REMOTE_TURN)
        durable_env._handler(dispatch.REMOTE_TURN)(**sent.options["kwargs"])
        (decision,) = durable_env.drop(dispatch.DECISION)
    held = Run.objects.get(id=run_id)
    with _as(OURS):
        assert decisions.apply(decision.options["kwargs"]) == "refused"
    now = Run.objects.get(id=run_id)
    assert (now.status, now.locked_by) == ("running", held.locked_by)
    assert not Checkpoint.objects.filter(run_id=run_id).exists()
    with _as(THEIRS):
        assert decisions.apply(decision.options["kwargs"]) == "suspended"


def test_run_step_of_another_namespace_is_refused_and_keeps_its_attempt(durable_env):
    run_id = durable.start(iso_flow, 1, namespace=THEIRS).id
    with _as(THEIRS):
        durable_env.run_next()  # the first turn sends the step
    (message,) = durable_env.drop(dispatch.RUN_STEP)
    with _as(OURS):
        assert steps.run_step(*message.args, **message.options.get("kwargs", {})) == "stale"
    row = Checkpoint.objects.get(run_id=run_id, seq=0)
    assert (row.status, row.attempt, row.started_at, row.held_by) == ("pending", 1, None, None)
    with _as(THEIRS):
        steps.run_step(*message.args, **message.options.get("kwargs", {}))
        durable_env.run_until_idle()
    assert durable.result(run_id) == 2


def test_results_and_beats_of_another_namespace_are_refused(durable_env):
    run_id = durable.start(iso_remote_flow, 3, namespace=THEIRS).id
    with _as(THEIRS):
        durable_env.run_next()
    durable_env.drop()
    row = Checkpoint.objects.get(run_id=run_id, seq=0)
    where = {"run_id": run_id, "seq": 0, "attempt": 1, "token": row.token}
    with _as(OURS):
        assert results_by_message.heartbeat(progress={"p": 1}, **where) is False
        assert results_by_message.step_result(output=666, **where) == "stale"
        assert results_by_message.step_result(error={"message": "no"}, **where) == "stale"
    now = Checkpoint.objects.get(pk=row.pk)
    assert (now.status, now.started_at, now.progress, now.attempt) == ("pending", None, None, 1)
    with _as(THEIRS):
        assert results_by_message.step_result(output=6, **where) == "completed"
        durable_env.run_until_idle()
    assert durable.result(run_id) == 6


def test_an_entity_op_of_another_namespace_is_not_applied(durable_env):
    with _as(THEIRS):
        durable.signal_entity("tests.iso_counter", "k", "add", 5)
    durable_env.drop()
    with _as(OURS):
        assert entity_ops.apply("tests.iso_counter", "k") == 0
    assert EntityOp.objects.get(entity="tests.iso_counter", key="k").status == "pending"
    assert EntityPrompt.objects.filter(name="tests.iso_counter", key="k").exists()  # not taken
    with _as(THEIRS):
        assert entity_ops.apply("tests.iso_counter", "k") == 1
    assert durable.entity_state("tests.iso_counter", "k") == {"total": 5}


def test_an_applier_stops_at_the_first_op_of_another_namespace(durable_env):
    with _as(OURS):
        durable.signal_entity("tests.iso_counter", "k", "add", 1)
    with _as(THEIRS):
        durable.signal_entity("tests.iso_counter", "k", "add", 10)
    with _as(OURS):
        durable.signal_entity("tests.iso_counter", "k", "add", 100)
    durable_env.drop()
    with _as(OURS):
        assert entity_ops.apply("tests.iso_counter", "k") == 1  # its own, up to theirs, in order
    assert durable.entity_state("tests.iso_counter", "k") == {"total": 1}
    with _as(THEIRS):
        assert entity_ops.apply("tests.iso_counter", "k") == 1
    with _as(OURS):
        assert entity_ops.apply("tests.iso_counter", "k") == 1
    assert durable.entity_state("tests.iso_counter", "k") == {"total": 111}
