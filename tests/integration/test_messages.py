"""``ctx.signal``, ``ctx.publish_event`` and ``ctx.start``: once per position, with the turn's commit."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint, Event, Run, Signal
from durable.replay.messages import started_run_id

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.msg_receiver")
def receiver(ctx, _):
    return ctx.wait_for_signal("hello")


@durable.workflow(name="tests.msg_event_waiter")
def event_waiter(ctx, order):
    return ctx.wait_for_event("shipped", match={"order": order})


@durable.workflow(name="tests.msg_sender")
def sender(ctx, target):
    ctx.signal(target, "hello", {"from": ctx.run_id})
    ctx.sleep("1m")  # more turns: each replays the signal's position
    ctx.sleep("1m")
    return "sent"


@durable.workflow(name="tests.msg_publisher")
def publisher(ctx, order):
    ctx.publish_event("shipped", {"order": order})
    ctx.sleep("1m")
    return "published"


@durable.workflow(name="tests.msg_starter")
def starter(ctx, given_id):
    first = ctx.start(receiver, None)
    second = ctx.start("tests.msg_receiver", None, run_id=given_id) if given_id else None
    ctx.sleep("1m")
    return [first, second]


@durable.workflow(name="tests.msg_to_nowhere")
def to_nowhere(ctx, target):
    try:
        ctx.signal(target, "hello")
    except (durable.RunNotFound, durable.RunFinished) as exc:
        ctx.sleep("1m")  # a replay must raise the same error at the same position
        return [type(exc).__name__, exc.message]
    return "sent"


@durable.workflow(name="tests.msg_taken_id")
def taken_id(ctx, run_id):
    try:
        ctx.start(receiver, None, run_id=run_id)
    except durable.InvalidInput as exc:
        return exc.message
    return "started"


def test_signal_reaches_the_other_run_once_however_often_the_sender_replays(durable_env):
    target = durable.start(receiver)
    durable_env.run_until_idle()
    run = durable.start(sender, target.id)
    durable_env.run_until_idle()
    durable_env.advance_time("1m")
    durable_env.advance_time("1m")
    assert durable.result(run.id) == "sent"
    assert durable.result(target.id) == {"from": run.id}
    assert Signal.objects.filter(run_id=target.id).count() == 1
    assert Checkpoint.objects.get(run_id=run.id, seq=0).kind == "send_signal"


def test_a_signal_sent_before_the_target_waits_is_kept_for_it(durable_env):
    target = durable.start(receiver, delay="10m")
    run = durable.start(sender, target.id)
    durable_env.run_until_idle()
    durable_env.advance_time("10m")
    assert durable.result(target.id) == {"from": run.id}


def test_signal_to_an_unknown_run_raises_run_not_found_in_the_body_on_every_replay(durable_env):
    run = durable.start(to_nowhere, "nobody")
    durable_env.run_until_idle()
    durable_env.advance_time("1m")
    assert durable.result(run.id) == ["RunNotFound", "no run has id 'nobody'; nothing was sent"]
    position = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (position.kind, position.status, position.error["type"]) == (
        "send_signal",
        "failed",
        "RunNotFound",
    )
    assert not Signal.objects.exists()


def test_signal_to_a_finished_run_raises_run_finished(durable_env):
    done = durable.start(receiver)
    durable_env.run_until_idle()
    durable.signal(done.id, "hello", 1)
    durable_env.run_until_idle()
    run = durable.start(to_nowhere, done.id)
    durable_env.run_until_idle()
    durable_env.advance_time("1m")
    assert durable.result(run.id)[0] == "RunFinished"
    assert Signal.objects.filter(run_id=done.id).count() == 1


@durable.workflow(name="tests.msg_self")
def self_signal(ctx, _):
    ctx.signal(ctx.run_id, "hello")


def test_signal_to_the_run_itself_is_refused(durable_env):
    run = durable.start(self_signal)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed, match="to the run itself"):
        durable.result(run.id)


def test_publish_event_reaches_a_waiting_run_once(durable_env):
    waiter = durable.start(event_waiter, 7)
    durable_env.run_until_idle()
    run = durable.start(publisher, 7)
    durable_env.run_until_idle()
    durable_env.advance_time("1m")
    assert durable.result(run.id) == "published"
    assert durable.result(waiter.id) == {"order": 7}
    assert Event.objects.filter(name="shipped").count() == 1


def test_start_creates_a_run_that_is_no_child_once_with_a_derived_id(durable_env):
    run = durable.start(starter, "tests-msg-given")
    durable_env.run_until_idle()
    durable_env.advance_time("1m")
    first, second = durable.result(run.id)
    assert first == started_run_id(run.id, 0)
    assert second == "tests-msg-given"
    started = Run.objects.filter(workflow="tests.msg_receiver")
    assert sorted(started.values_list("id", flat=True)) == sorted([first, second])
    assert all(r.parent_id is None for r in started)
    assert Checkpoint.objects.get(run_id=run.id, seq=0).kind == "start"


def test_start_with_an_id_of_another_workflow_raises_invalid_input_in_the_body(durable_env):
    other = durable.start(event_waiter, 1)
    run = durable.start(taken_id, other.id)
    durable_env.run_until_idle()
    assert "already belongs to workflow 'tests.msg_event_waiter'" in durable.result(run.id)


def test_start_refuses_input_the_workflow_refuses_before_recording(durable_env):
    @durable.workflow(name="tests.msg_strict", validate_input=lambda value: int(value))
    def strict(ctx, value):
        return value

    @durable.workflow(name="tests.msg_start_strict")
    def start_strict(ctx, value):
        try:
            ctx.start(strict, value)
        except durable.InvalidInput as exc:
            return exc.message
        return "started"

    run = durable.start(start_strict, "not a number")
    durable_env.run_until_idle()
    assert "refused its input" in durable.result(run.id)
    assert not Checkpoint.objects.filter(run_id=run.id).exists()


# -- a turn that loses its lease sends nothing ------------------------------------------------

stolen: list[str] = []


@durable.step(local=True)
def steal_the_lease(run_id):
    """Another worker takes the run over while this turn runs (once)."""
    if not stolen:
        stolen.append(run_id)
        Run.objects.filter(id=run_id).update(locked_by="another-worker/abc")
    return "ok"


@durable.workflow(name="tests.msg_lost_before_flush")
def lost_before_flush(ctx, target):
    ctx.signal(target, "hello", "once")
    ctx.start(receiver, None)
    ctx.publish_event("lost.event", {"n": 1})
    ctx.step(steal_the_lease, ctx.run_id)  # its record is flushed with the messages, fenced
    return "done"


@durable.workflow(name="tests.msg_lost_before_settle")
def lost_before_settle(ctx, target):
    ctx.step(steal_the_lease, ctx.run_id)
    ctx.signal(target, "hello", "once")
    ctx.start(receiver, None)
    ctx.publish_event("lost.event", {"n": 1})
    return "done"


def _give_back(run_id):
    # The other worker's lease lapses; the next turn takes the run.
    Run.objects.filter(id=run_id).update(locked_by=None, locked_until=None, status="suspended")


@pytest.mark.parametrize("workflow", [lost_before_flush, lost_before_settle])
def test_a_turn_that_loses_its_lease_sends_nothing_and_the_next_sends_once(durable_env, workflow):
    stolen.clear()
    target = durable.start(receiver)
    durable_env.run_until_idle()
    run = durable.start(workflow, target.id)
    durable_env.run_until_idle()
    assert stolen == [run.id]
    assert not Signal.objects.exists()
    assert not Event.objects.filter(name="lost.event").exists()
    assert Run.objects.filter(workflow="tests.msg_receiver").count() == 1  # only the target
    _give_back(run.id)
    durable_env.advance_time("10m")
    assert durable.result(run.id) == "done"
    assert durable.result(target.id) == "once"
    assert Signal.objects.count() == 1
    assert Event.objects.filter(name="lost.event").count() == 1
    assert Run.objects.filter(workflow="tests.msg_receiver").count() == 2
