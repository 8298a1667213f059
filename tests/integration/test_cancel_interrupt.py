"""``durable.cancel(run_id, interrupt=True)`` through durable_env: ``Cancelled`` is raised at the
body's current wait, its except/finally may run steps, the run ends cancelled unless the body
returns a value, and a dispatched step of the run sees ``StepCancelled`` at its next heartbeat."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import shared_task

import durable
from durable import conf
from durable.engine import results_by_message
from durable.engine.attempts import Beats
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@durable.step(name="tests.cancel_interrupt.tidy")
def tidy():
    durable.heartbeat({"tidying": True})  # a cleanup step that beats is not stopped
    RAN.append("tidy")
    return "tidy"


@durable.step(name="tests.cancel_interrupt.beats", heartbeat_timeout="1m")
def beats(cancel_own_run):
    RAN.append("beats")
    if cancel_own_run:
        durable.cancel(durable.step_info().run_id, interrupt=True, reason="stop it")
    durable.heartbeat()
    RAN.append("beats went on")
    return "beat"


@durable.workflow(name="tests.cancel_interrupt.waits")
def waits(ctx, _):
    try:
        return ctx.wait_for_signal("go")
    finally:
        ctx.step(tidy)


@durable.workflow(name="tests.cancel_interrupt.returns")
def returns(ctx, _):
    try:
        return ctx.wait_for_signal("go")
    except durable.Cancelled as exc:
        return f"cancelled: {exc.message}"


@durable.workflow(name="tests.cancel_interrupt.stepping")
def stepping(ctx, cancel_own_run):
    try:
        return ctx.step(beats, cancel_own_run)
    finally:
        ctx.step(tidy)


@durable.step(name="tests.cancel_interrupt.reserve")
def reserve():
    RAN.append("reserve")
    return "res-1"


@reserve.compensation
def release(reservation):
    RAN.append(f"release {reservation}")


@durable.workflow(name="tests.cancel_interrupt.saga")
def saga(ctx, _):
    ctx.step(reserve)
    try:
        return ctx.wait_for_signal("go")
    finally:
        ctx.step(tidy)


@durable.step(name="tests.cancel_interrupt.in_place")
def in_place():
    RAN.append("in place")
    durable.cancel(durable.step_info().run_id, interrupt=True, reason="mid-turn")
    durable.heartbeat()
    return "went on"


@durable.workflow(name="tests.cancel_interrupt.in_place_flow")
def in_place_flow(ctx, _):
    try:
        return ctx.step(in_place)
    finally:
        ctx.step(tidy)


@durable.step(name="tests.cancel_interrupt.quick")
def quick():
    RAN.append("quick")
    return "quick"


@durable.workflow(name="tests.cancel_interrupt.quick_then_tidy")
def quick_then_tidy(ctx, _):
    try:
        return ctx.step(quick)
    finally:
        ctx.step(tidy)


def kinds(run_id):
    return list(Checkpoint.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))


def test_cancel_with_interrupt_runs_the_finally_cleanup_once_and_ends_cancelled(durable_env):
    run = durable.start(waits)
    durable_env.run_until_idle()
    assert durable.cancel(run.id, interrupt=True, reason="customer left") is True
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "cancelled"
    assert record.error == {
        "message": "customer left",
        "type": "Cancelled",
        "code": "cancelled",
        "details": None,
    }
    assert RAN == ["tidy"]
    assert kinds(run.id) == ["signal", "cancel", "step"]
    with pytest.raises(durable.RunCancelled):
        durable.result(run.id)


def test_a_body_that_catches_cancelled_and_returns_completes(durable_env):
    run = durable.start(returns)
    durable_env.run_until_idle()
    durable.cancel(run.id, interrupt=True)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "cancelled: cancelled"


def test_a_running_step_sees_step_cancelled_at_its_next_heartbeat(durable_env):
    run = durable.start(stepping, True)
    durable_env.run_until_idle()
    assert RAN == ["beats", "tidy"]  # it stopped at the heartbeat; the cleanup ran once
    step = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (step.status, step.attempt, step.error["type"], step.error["code"]) == (
        "failed",
        1,
        "StepCancelled",
        "cancelled",
    )
    assert kinds(run.id) == ["step", "cancel", "step"]
    assert durable.get_run(run.id).status == "cancelled"


def test_a_step_cancelled_before_the_body_heard_of_it_still_raises_cancelled_in_the_body(durable_env):
    run = durable.start(stepping, False)
    durable_env.run_next()  # the turn sends the step
    durable.cancel(run.id, interrupt=True)
    # The step runs before the turn the cancel sent: it stops at its heartbeat first.
    durable_env.run_until_idle()
    assert RAN == ["beats", "tidy"]
    assert durable.get_run(run.id).status == "cancelled"
    assert kinds(run.id) == ["step", "cancel", "step"]


def test_a_plain_cancel_runs_no_code_of_the_body(durable_env):
    run = durable.start(waits)
    durable_env.run_until_idle()
    durable.cancel(run.id)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "cancelled" and RAN == []


def test_interrupt_on_a_finished_run_returns_false(durable_env):
    run = durable.start(returns)
    durable_env.run_until_idle()
    durable.signal(run.id, "go", "now")
    durable_env.run_until_idle()
    assert durable.cancel(run.id, interrupt=True) is False
    assert durable.result(run.id) == "now"


def test_interrupt_must_be_a_bool(durable_env):
    run = durable.start(waits)
    with pytest.raises(durable.InvalidInput, match="interrupt"):
        durable.cancel(run.id, interrupt="yes")


def test_retry_of_an_interrupted_run_replays_its_cancel(durable_env):
    run = durable.start(waits)
    durable_env.run_until_idle()
    durable.cancel(run.id, interrupt=True)
    durable_env.run_until_idle()
    durable.retry(run.id)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "cancelled"
    assert RAN == ["tidy"]  # the cleanup replays as recorded, it does not run again


@shared_task(name="tests.cancel_interrupt.celery_task")
def celery_task():
    return "done"


@durable.workflow(name="tests.cancel_interrupt.celery_flow")
def celery_flow(ctx, _):
    return ctx.step(celery_task)


def test_a_celery_task_beating_by_message_is_told_to_stop(durable_env):
    run = durable.start(celery_flow)
    durable_env.run_next()
    durable_env.drop()
    token = Checkpoint.objects.get(run_id=run.id, seq=0).token
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 1}, token=token) is True
    durable.cancel(run.id, interrupt=True)
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 2}, token=token) is False
    assert Checkpoint.objects.get(run_id=run.id, seq=0).progress == {"done": 1}


def test_a_heartbeat_timeout_step_persists_beats_within_the_grace_whatever_the_throttle(db):
    settings = conf.get()
    assert timedelta(seconds=10) == settings.HEARTBEAT_PERSIST_THROTTLE
    assert Beats("r", 0, 1, settings, timedelta(seconds=2)).throttle == timedelta(milliseconds=250)
    assert Beats("r", 0, 1, settings, timedelta(minutes=1)).throttle == timedelta(seconds=1)
    assert Beats("r", 0, 1, settings).throttle == timedelta(seconds=10)


def test_interrupt_with_compensate_cleans_up_then_unwinds_the_saga(durable_env):
    run = durable.start(saga)
    durable_env.run_until_idle()
    assert durable.cancel(run.id, interrupt=True, compensate=True) is True
    durable_env.run_until_idle()
    assert RAN == ["reserve", "tidy", "release res-1"]
    record = durable.get_run(run.id)
    assert (record.status, record.error["code"]) == ("cancelled", "cancelled")


def test_a_step_run_in_place_stopped_by_a_cancel_the_turn_had_not_read_raises_cancelled(
    durable_env, monkeypatch
):
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    run = durable.start(in_place_flow)
    durable_env.run_until_idle()
    assert RAN == ["in place", "tidy"]
    assert kinds(run.id) == ["step", "cancel", "step"]
    record = durable.get_run(run.id)
    assert (record.status, record.error["message"]) == ("cancelled", "mid-turn")


def test_a_cancel_that_comes_after_the_awaited_step_ended_still_runs_the_cleanup(durable_env, settings):
    """The step the run waits on completes (on a worker that does not run turns), then the cancel
    comes, before the turn they both wake: ``Cancelled`` is raised at that step, where the run
    was, and the cleanup in ``finally`` runs (raised at the cleanup step instead, it would be
    recorded and never run)."""
    settings.DURABLE = {**settings.DURABLE, "INLINE_NEXT_TURN": False, "EAGER_STEPS": False}
    run = durable.start(quick_then_tidy)
    assert durable_env.run_next().task == "durable.advance"  # the first turn sends the step
    assert durable_env.run_next().task == "durable.run_step"  # it ends; its run is woken
    assert durable.cancel(run.id, interrupt=True, reason="too late") is True
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "cancelled"
    assert RAN == ["quick", "tidy"]
    assert kinds(run.id) == ["step", "cancel", "step"]
