"""Remote turns: a workflow whose turns run on workers with no database, by message.

The harness runs ``durable.remote_turn`` as a database-less worker would, from the message alone
(``durable.remote.run_turn``); what it decides comes back as ``durable.decision``.
"""

from __future__ import annotations

import jsonschema
import pytest
from django.test import override_settings
from referencing import Registry, Resource

import durable
from durable import dispatch, protocol
from durable.engine import decisions, remote_turns
from durable.errors import InvalidInput
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

TURNS = "rt-turns"
NAMES = ("record", "turn", "decision", "turn_heartbeat")
REGISTRY = Registry().with_resources(
    (protocol.schema(name)["$id"], Resource.from_contents(protocol.schema(name))) for name in NAMES
)


def _validate(instance, name):
    jsonschema.Draft202012Validator(protocol.schema(name), registry=REGISTRY).validate(instance)


@durable.step(name="tests.rt_double")
def rt_double(x):
    return x * 2


@durable.workflow(name="tests.rt_flow", remote=True, queue=TURNS)
def rt_flow(ctx, x):
    doubled = ctx.step(rt_double, x)
    said = ctx.wait_for_signal("go")
    return {"doubled": doubled, "said": said}


@durable.workflow(name="tests.rt_by_setting", queue="rt-setting")
def rt_by_setting(ctx, x):
    return ctx.step(rt_double, x)


@durable.workflow(name="tests.rt_event", remote=True, queue=TURNS)
def rt_event(ctx, _):
    return ctx.wait_for_event("never")


def _one(durable_env, task):
    (message,) = [m for m in durable_env.pending() if m.task == task]
    return message


def _take(durable_env, task):
    message = _one(durable_env, task)
    durable_env.messages.remove(message)
    return message


def _turn_sent(durable_env, workflow=rt_flow, arg=5):
    """Start a run and claim its first turn: the turn message it sends to the remote queue."""
    run = durable.start(workflow, arg)
    advance = _take(durable_env, dispatch.ADVANCE)
    # The claim is made by durable's own workers: the advance goes to the default queue.
    assert advance.queue == "durable"
    durable_env._handler(dispatch.ADVANCE)(*advance.args)
    return run, _take(durable_env, dispatch.REMOTE_TURN)


def _decided(durable_env, turn):
    durable_env._handler(dispatch.REMOTE_TURN)(**turn.options["kwargs"])
    return _take(durable_env, dispatch.DECISION).options["kwargs"]


def test_a_turn_message_carries_what_the_replay_needs(durable_env):
    run, turn = _turn_sent(durable_env)
    assert turn.queue == TURNS
    message = turn.options["kwargs"]["turn"]
    _validate(message, "turn")
    held = Run.objects.get(id=run.id)
    assert held.status == "running" and held.locked_by == message["turn"]
    assert message["run"] == {
        "id": run.id,
        "workflow": "tests.rt_flow",
        "version": "1",
        "namespace": None,
        "input": 5,
        "deadline": None,
        "cancel_request": None,
    }
    assert message["records"] == [] and message["reply_to"] == "durable"


def test_a_decision_is_applied_with_the_writes_of_a_local_turn(durable_env):
    run, turn = _turn_sent(durable_env)
    decision = _decided(durable_env, turn)
    _validate(decision, "decision")
    assert decision["status"] == "suspended" and decision["dispatch"] == [0]
    assert not Checkpoint.objects.filter(run_id=run.id).exists()  # nothing written remotely
    assert decisions.apply(decision) == "suspended"
    step = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert step.name == "tests.rt_double" and step.enqueued_at is not None
    assert Run.objects.get(id=run.id).locked_by is None
    assert [m.task for m in durable_env.pending()] == [dispatch.RUN_STEP]
    durable_env.run_until_idle()
    durable.signal(run.id, "go", "now")
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"doubled": 10, "said": "now"}
    # Each turn went out by message: the run has no turn that ran in this process's body.
    assert Run.objects.get(id=run.id).status == "completed"


def test_a_duplicated_decision_changes_nothing(durable_env):
    run, turn = _turn_sent(durable_env)
    decision = _decided(durable_env, turn)
    assert decisions.apply(decision) == "suspended"
    before = list(Checkpoint.objects.filter(run_id=run.id).values())
    sent = len(durable_env.pending())
    assert decisions.apply(dict(decision)) == "refused"
    assert list(Checkpoint.objects.filter(run_id=run.id).values()) == before
    assert len(durable_env.pending()) == sent  # no second step message


def test_a_decision_whose_lease_was_taken_over_is_refused(durable_env):
    run, turn = _turn_sent(durable_env)
    stale = _decided(durable_env, turn)
    # The remote worker went quiet: the lease lapses and the orphan sweep sends the turn again.
    from durable import conf

    durable_env._freezer.tick(conf.get().LEASE * 2)
    from durable.engine import sweeps

    assert sweeps.sweep_orphans() == 1
    durable_env._handler(dispatch.ADVANCE)(*_take(durable_env, dispatch.ADVANCE).args)
    again = _take(durable_env, dispatch.REMOTE_TURN).options["kwargs"]["turn"]
    assert again["turn"] != stale["turn"]
    assert decisions.apply(stale) == "refused"
    assert not Checkpoint.objects.filter(run_id=run.id).exists()
    assert Run.objects.get(id=run.id).locked_by == again["turn"]
    # The new turn's own decision is applied.
    durable_env._handler(dispatch.REMOTE_TURN)(turn=again)
    assert decisions.apply(_take(durable_env, dispatch.DECISION).options["kwargs"]) == "suspended"
    assert Checkpoint.objects.filter(run_id=run.id).count() == 1


def test_turn_heartbeats_keep_the_lease_of_the_turn_holding_it(durable_env):
    from durable import conf

    run, turn = _turn_sent(durable_env)
    message = turn.options["kwargs"]["turn"]
    _validate({"run_id": run.id, "turn": message["turn"]}, "turn_heartbeat")
    durable_env._freezer.tick(conf.get().LEASE * 0.9)
    assert remote_turns.heartbeat(run.id, message["turn"])
    durable_env._freezer.tick(conf.get().LEASE * 0.9)
    from durable.engine import sweeps

    assert sweeps.sweep_orphans() == 0  # renewed: not an orphan
    assert not remote_turns.heartbeat(run.id, "someone-else/123")


def test_a_wake_during_the_remote_turn_makes_it_run_again(durable_env):
    run, turn = _turn_sent(durable_env)
    decision = _decided(durable_env, turn)
    durable.signal(run.id, "go", "early")
    assert decisions.apply(decision) == "rerun"
    assert not Checkpoint.objects.filter(run_id=run.id).exists()
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"doubled": 10, "said": "early"}


def test_remote_queues_make_a_workflows_turns_remote(durable_env):
    with override_settings(DURABLE={"REMOTE_QUEUES": ["rt-setting"]}):
        run, turn = _turn_sent(durable_env, rt_by_setting, 4)
        assert turn.queue == "rt-setting"
        durable_env.messages.append(turn)  # taken out to look at: sent on
        durable_env.run_until_idle()
        assert durable.result(run.id) == 8


def test_a_remote_turn_refuses_what_needs_the_database(durable_env):
    run = durable.start(rt_event, None)
    durable_env.run_until_idle()
    assert Run.objects.get(id=run.id).status == "failed"
    assert "remote turn" in Run.objects.get(id=run.id).error["message"]


def test_a_remote_workflow_names_its_queue():
    with pytest.raises(InvalidInput, match="queue"):
        durable.workflow(name="tests.rt_no_queue", remote=True)(lambda ctx, _: None)
    with pytest.raises(InvalidInput, match="remote="):
        durable.workflow(name="tests.rt_bad", remote="yes", queue="q")(lambda ctx, _: None)


@durable.workflow(name="tests.rt_child")
def rt_child(ctx, x):
    return ctx.step(rt_double, x)


@durable.workflow(name="tests.rt_parent", remote=True, queue=TURNS)
def rt_parent(ctx, n):
    got = ctx.child(rt_child, n)
    if n < 3:
        ctx.continue_as_new(n + 1)
    return {"n": n, "child": got}


def test_children_and_continue_as_new_go_through_decisions(durable_env):
    run = durable.start(rt_parent, 1)
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"n": 3, "child": 6}
    assert Run.objects.filter(workflow="tests.rt_parent").count() == 3
    assert Run.objects.filter(workflow="tests.rt_child", status="completed").count() == 3


def test_a_forged_decision_is_refused(durable_env):
    run, turn = _turn_sent(durable_env)
    decision = _decided(durable_env, turn)
    for forged in (
        {**decision, "turn": "forged/1"},
        {**decision, "turn": ""},
        {**decision, "run_id": "nope"},
    ):
        assert decisions.apply(forged) == "refused"
    assert not Checkpoint.objects.filter(run_id=run.id).exists()
    assert decisions.apply(decision) == "suspended"
