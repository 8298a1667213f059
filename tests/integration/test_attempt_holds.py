"""Step attempts are held by the process running them, and only durable's own messages move them.

A holder that stops renewing (its process died, its result could not be recorded) makes the
attempt count as lost (``worker_lost``) for the retry policy; a redelivered message never runs a
started attempt again; a message without the attempt's token changes nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import durable
from durable import clock, dispatch
from durable.engine import lifecycle, results_by_message, steps
from durable.errors import _ControlFlow
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


@durable.step(retry=durable.Retry(max_attempts=2, initial="1s"))
def work(name):
    """No timeout, no heartbeat_timeout: its liveness is its hold alone."""
    RAN.append(name)
    return name


class ProcessDied(_ControlFlow):
    """Stands for the process dying mid-step: nothing after it runs in that process, and nothing
    in durable turns control flow into a failed attempt."""


@durable.step(retry=durable.Retry(max_attempts=2, initial="1s"))
def always_dies():
    RAN.append("dies")
    raise ProcessDied()


@durable.step
def untimed(name):
    RAN.append(name)
    return name


@durable.step(timeout="1m")
def beats_big():
    durable.heartbeat("x" * 2048)
    return "never"


@durable.step(timeout="1m", retry=durable.Retry(max_attempts=1))
def raises_nul():
    raise ValueError("a NUL \x00 in the message")


@durable.workflow(name="tests.holds.one")
def one(ctx, name):
    return ctx.step(work, name)


@durable.workflow(name="tests.holds.dies")
def dies(ctx, _):
    return ctx.step(always_dies)


@durable.workflow(name="tests.holds.untimed")
def untimed_flow(ctx, name):
    return ctx.step(untimed, name)


@durable.workflow(name="tests.holds.big_beat")
def big_beat(ctx, _):
    return ctx.step(beats_big)


@durable.workflow(name="tests.holds.nul")
def nul(ctx, _):
    return ctx.step(raises_nul)


def _row(run_id: str) -> Checkpoint:
    return Checkpoint.objects.get(run_id=run_id, seq=0)


def _sent(env) -> dispatch.Message:
    (message,) = env.drop(dispatch.RUN_STEP)
    return message


def _die_holding(message: dispatch.Message) -> None:
    """What a process that took the attempt and died leaves behind: the attempt started, held."""
    run_id, seq, attempt, token = message.args
    now = clock.now()
    assert Checkpoint.objects.take(run_id, seq, attempt, token, "dead/1", now, now + timedelta(seconds=30))


def test_a_redelivered_message_never_runs_a_started_attempt_again(durable_env):
    run = durable.start(one, "a")
    durable_env.run_next()
    message = _sent(durable_env)
    _die_holding(message)
    assert steps.run_step(*message.args) == "stale"  # the redelivery, while the hold lasts
    durable_env.advance_time("31s")
    assert steps.run_step(*message.args) == "stale"  # and after it lapsed: still never as itself
    assert RAN == []
    row = _row(run.id)
    assert (row.attempt, row.error["code"]) == (2, "worker_lost")  # the lapse ended attempt 1


def test_an_attempt_whose_holder_died_is_lost_and_retried_within_a_lease(durable_env):
    run = durable.start(one, "a")
    durable_env.run_next()
    first = _sent(durable_env)
    _die_holding(first)
    durable_env.advance_time("29s")
    assert (_row(run.id).attempt, durable.get_run(run.id).status) == (1, "suspended")  # still held
    durable_env.advance_time("2s")  # the hold lapsed: the orphan sweep wakes the run
    row = _row(run.id)
    assert (row.status, row.attempt, row.error["code"]) == ("pending", 2, "worker_lost")
    assert row.held_by is None and row.held_until is None and row.token is None
    durable_env.advance_time("2s")  # the retry's backoff; its message is sent and runs
    assert durable.result(run.id) == "a"
    assert RAN == ["a"]
    assert (_row(run.id).status, _row(run.id).attempt) == ("completed", 2)


def test_a_second_lost_attempt_fails_the_step_with_worker_lost(durable_env):
    run = durable.start(dies)
    with pytest.raises(ProcessDied):
        durable_env.run_until_idle()
    durable_env.advance_time("31s")  # the hold lapsed: attempt 1 is lost
    with pytest.raises(ProcessDied):
        durable_env.advance_time("2s")  # attempt 2, after its backoff, dies too
    durable_env.advance_time("31s")
    assert RAN == ["dies", "dies"]
    assert durable.get_run(run.id).status == "failed"
    assert durable.get_run(run.id).error["code"] == "worker_lost"
    assert (_row(run.id).status, _row(run.id).attempt) == ("failed", 2)


def test_a_live_holder_keeps_its_attempt_past_any_lease(durable_env):
    run = durable.start(untimed_flow, "a")
    durable_env.run_next()
    run_id, seq, attempt, token = _sent(durable_env).args
    now = clock.now()
    assert Checkpoint.objects.take(run_id, seq, attempt, token, "alive/1", now, now + timedelta(seconds=30))
    for _ in range(6):  # the keeper renews it every few seconds
        durable_env.advance_time("20s")
        assert Checkpoint.objects.renew_hold(
            run_id, seq, attempt, "alive/1", clock.now() + timedelta(seconds=30)
        )
    assert (_row(run.id).status, _row(run.id).attempt) == ("pending", 1)
    assert durable.get_run(run.id).status == "suspended"


def test_messages_without_the_attempts_token_change_nothing(durable_env):
    run = durable.start(one, "a")
    durable_env.run_next()
    run_id, seq, attempt, token = _sent(durable_env).args
    assert steps.run_step(run_id, seq, attempt) == "stale"
    assert steps.run_step(run_id, seq, attempt, "guessed") == "stale"
    # A durable step's result is recorded by the worker that ran it, never from a message.
    assert results_by_message.step_result(run_id, seq, attempt, output={"forged": True}) == "stale"
    assert (
        results_by_message.step_result(run_id, seq, attempt, output={"forged": True}, token=token) == "stale"
    )
    assert results_by_message.heartbeat(run_id, seq, attempt, {"forged": True}, token=token) is False
    row = _row(run_id)
    assert (row.status, row.output, row.started_at, row.progress) == ("pending", None, None, None)
    assert steps.run_step(run_id, seq, attempt, token) == "completed"
    assert durable.result(run.id) == "a"


def test_a_forged_run_step_cannot_skip_a_retry_backoff(durable_env):
    @durable.step(name="tests.holds.flaky", timeout="1m", retry=durable.Retry(max_attempts=3, initial="1h"))
    def flaky():
        RAN.append("flaky")
        raise ConnectionError("down")

    @durable.workflow(name="tests.holds.flaky_flow")
    def flaky_flow(ctx, _):
        return ctx.step(flaky)

    run = durable.start(flaky_flow)
    durable_env.run_until_idle()
    assert (_row(run.id).attempt, RAN) == (2, ["flaky"])  # waiting out an hour's backoff
    assert steps.run_step(run.id, 0, 2) == "stale"
    assert steps.run_step(run.id, 0, 2, None) == "stale"
    assert RAN == ["flaky"]


def test_a_resend_after_a_redelivery_refuses_the_old_message(durable_env):
    run = durable.start(one, "a")
    durable_env.run_next()
    old = _sent(durable_env)  # committed, maybe never published by a sender that died
    lifecycle.resend_unsent(run.id)
    durable_env.run_next()  # the turn it asks for sends the attempt again
    new = _sent(durable_env)
    assert new.args[:3] == old.args[:3] and new.args[3] != old.args[3]
    assert steps.run_step(*old.args) == "stale"
    assert steps.run_step(*new.args) == "completed"
    assert RAN == ["a"]


def test_an_orphaned_run_sends_again_what_its_dead_turn_may_not_have_published(durable_env):
    run = durable.start(one, "a")
    durable_env.run_next()
    old = _sent(durable_env)
    now = clock.now()
    # A later turn of this run died holding the lease (its sends possibly unpublished).
    Run.objects.filter(id=run.id).update(
        status="running", locked_by="dead/2", locked_until=now - timedelta(seconds=1)
    )
    durable_env.sweep()
    assert durable.result(run.id) == "a"
    assert steps.run_step(*old.args) == "stale"
    assert RAN == ["a"]
    assert durable.get_run(run.id).recovery_attempts == 0  # parked, not counted: a step was in flight


@override_settings(DURABLE={"MAX_PAYLOAD_BYTES": 1024})
def test_heartbeat_progress_over_max_payload_bytes_is_refused(durable_env):
    run = durable.start(big_beat)
    durable_env.run_until_idle()
    row = _row(run.id)
    assert row.progress is None
    assert row.status == "failed" and "MAX_PAYLOAD_BYTES" in row.error["message"]
    # The same from a worker that only speaks Celery: dropped, nothing stored.
    other = durable.start(one, "b")
    durable_env.run_next()
    run_id, seq, attempt, token = _sent(durable_env).args
    assert results_by_message.heartbeat(run_id, seq, attempt, "x" * 2048, token=token) is False
    assert _row(other.id).progress is None


def test_an_error_message_with_a_nul_character_is_stored(durable_env):
    run = durable.start(nul)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "failed"
    assert _row(run.id).error["message"] == "a NUL \\x00 in the message"


def test_a_string_error_from_a_foreign_worker_fails_the_step_cleanly(durable_env):
    @durable.workflow(name="tests.holds.task_flow")
    def task_flow(ctx, _):
        return ctx.step("tests.holds.remote_task")

    run = durable.start(task_flow)
    durable_env.run_next()
    durable_env.drop()
    token = _row(run.id).token
    assert results_by_message.step_result(run.id, 0, 1, error="it broke", token=token) == "failed"
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "failed"
    assert _row(run.id).error == {"message": "it broke", "type": "Error", "code": None, "details": None}
