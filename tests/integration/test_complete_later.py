"""Steps completed from outside: ``durable.CompleteLater`` and ``durable.complete_step(token)``."""

from __future__ import annotations

import sys

import pytest

import durable
from durable import tasks
from durable.durations import parse_duration
from durable.engine import histories, lifecycle
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

#: The tokens the steps handed "to another system", newest last.
handed: list[str] = []


@pytest.fixture(autouse=True)
def _fresh():
    handed.clear()


@durable.step(name="tests.later.approve", retry=durable.Retry(max_attempts=2, initial="1s"))
def ask_for_approval(order):
    handed.append(durable.step_info().token)
    raise durable.CompleteLater()


@durable.step(name="tests.later.bounded", timeout="1m", retry=durable.Retry(max_attempts=2, initial="1s"))
def bounded(order):
    handed.append(durable.step_info().token)
    raise durable.CompleteLater()


@durable.step(name="tests.later.local", local=True)
def local_later():
    raise durable.CompleteLater()


@durable.workflow(name="tests.later.flow")
def flow(ctx, order):
    try:
        return ctx.step(ask_for_approval, order)
    except durable.StepFailed as exc:
        return {"failed": exc.message}


@durable.workflow(name="tests.later.bounded_flow")
def bounded_flow(ctx, order):
    try:
        return ctx.step(bounded, order)
    except durable.StepFailed as exc:
        return {"failed": exc.code}


@durable.workflow(name="tests.later.local_flow")
def local_flow(ctx, _):
    return ctx.step(local_later)


def _position(run_id):
    return Checkpoint.objects.get(run_id=run_id, seq=0)


def test_an_attempt_waits_open_and_unheld_until_completed_with_its_token(durable_env):
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    position = _position(run.id)
    assert (position.status, position.attempt, position.held_by, position.held_until) == (
        "pending",
        1,
        None,
        None,
    )
    assert durable.get_run(run.id).status == "suspended"
    durable.complete_step(handed[-1], {"approved": True})
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"approved": True}
    assert len(handed) == 1  # the step ran once


def test_an_open_attempt_is_never_judged_lost(durable_env):
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    durable_env.advance_time("2h")  # many leases and sweeps later
    position = _position(run.id)
    assert (position.status, position.attempt, position.error) == ("pending", 1, None)
    durable.complete_step(handed[-1], "late but fine")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "late but fine"


def test_a_completion_with_an_error_fails_the_attempt_under_the_retry_policy(durable_env):
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    durable.complete_step(handed[-1], error=ValueError("refused by the clerk"))
    durable_env.advance_time("5s")
    assert len(handed) == 2  # a second attempt, with a token of its own
    assert handed[0] != handed[1]
    durable.complete_step(handed[-1], error={"message": "refused again", "code": "refused"})
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"failed": "refused again"}


def test_a_replayed_token_changes_nothing_and_says_so(durable_env):
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    durable.complete_step(handed[-1], 1)
    durable_env.run_until_idle()
    with pytest.raises(durable.DurableError, match="settled already") as caught:
        durable.complete_step(handed[-1], 2)
    assert caught.value.code == "already_settled"
    assert durable.result(run.id) == 1


@pytest.mark.parametrize(
    "forge",
    [
        lambda token: token[:-1] + ("x" if token[-1] != "x" else "y"),  # another run id
        lambda token: ".".join([*token.split(".", 3)[:2], "forged-secret", token.split(".", 3)[3]]),
        lambda token: "2" + token[1:] if token[0] != "2" else "3" + token[1:],  # another attempt
        lambda token: "not a token",
        lambda token: None,
    ],
)
def test_a_wrong_or_forged_token_changes_nothing(durable_env, forge):
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    with pytest.raises(durable.InvalidInput):
        durable.complete_step(forge(handed[-1]), "forged")
    durable_env.run_until_idle()
    assert _position(run.id).status == "pending"
    assert durable.get_run(run.id).status == "suspended"


def test_the_step_result_task_completes_with_a_token_alone(durable_env):
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    assert tasks.step_result("forged", token="0.1.nope.nobody") == "stale"
    assert tasks.step_result({"via": "task"}, token=handed[-1]) == "completed"
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"via": "task"}


def test_an_attempt_not_completed_within_its_timeout_is_retried_then_fails(durable_env):
    run = durable.start(bounded_flow, 7)
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    durable_env.advance_time("2s")  # past the retry's backoff
    assert len(handed) == 2
    durable_env.advance_time("2m")
    assert durable.result(run.id) == {"failed": "timeout"}
    with pytest.raises(durable.InvalidInput):
        durable.complete_step(handed[0], "too late")


@durable.step(name="tests.later.fast_partner")
def fast_partner():
    handed.append(durable.step_info().token)
    durable.complete_step(durable.step_info().token, "answered at once")
    raise durable.CompleteLater()


@durable.workflow(name="tests.later.fast_flow")
def fast_flow(ctx, _):
    return ctx.step(fast_partner)


@pytest.mark.parametrize("in_place", [False, True], ids=["dispatched", "in place"])
def test_a_completion_that_comes_before_the_step_raised_wins(durable_env, monkeypatch, in_place):
    if in_place:
        monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    run = durable.start(fast_flow)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "answered at once"
    assert len(handed) == 1


def test_a_local_step_cannot_complete_later(durable_env):
    run = durable.start(local_flow)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed, match="drop local=True"):
        durable.result(run.id)


def test_an_in_place_step_that_completes_later_lets_the_turn_go(durable_env, monkeypatch):
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    position = _position(run.id)
    assert position.enqueued_at is not None and position.started_at is not None
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("1h")  # a later turn does not count it lost with the turn that ran it
    assert _position(run.id).attempt == 1
    durable.complete_step(handed[-1], "done in place")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "done in place"
    assert len(handed) == 1


@durable.step(name="tests.later.beaten", heartbeat_timeout="1m", retry=durable.Retry(max_attempts=1))
def beaten():
    handed.append(durable.step_info().token)
    raise durable.CompleteLater()


@durable.workflow(name="tests.later.beaten_flow")
def beaten_flow(ctx, _):
    try:
        return ctx.step(beaten)
    except durable.StepFailed as exc:
        return {"failed": exc.code}


def test_beats_by_token_keep_an_attempt_alive_past_its_heartbeat_timeout(durable_env):
    run = durable.start(beaten_flow)
    durable_env.run_until_idle()
    for minute in range(3):  # three heartbeat_timeouts in all, a beat every 40 s
        durable_env.advance_time("40s")
        assert durable.heartbeat_step(handed[0], {"pages": minute}) is True
    durable_env.advance_time("40s")
    assert durable.get_run(run.id).status != "completed"
    assert _position(run.id).progress == {"pages": 2}
    durable.complete_step(handed[0], "done")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "done"
    assert durable.heartbeat_step(handed[0]) is False  # settled: nothing to keep alive


def test_without_beats_the_attempt_times_out_at_its_heartbeat_timeout(durable_env):
    run = durable.start(beaten_flow)
    durable_env.run_until_idle()
    durable_env.advance_time("40s")
    assert durable.heartbeat_step(handed[0]) is True
    durable_env.advance_time("90s")  # past the last beat's heartbeat_timeout and its grace
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"failed": "timeout"}
    with pytest.raises(durable.InvalidInput):  # the attempt that token named is gone
        durable.heartbeat_step(handed[0])


@durable.step(name="tests.later.slow_to_hand", heartbeat_timeout="1m", retry=durable.Retry(max_attempts=1))
def slow_to_hand():
    _took()  # the body's own work before it hands the token out: most of a heartbeat_timeout
    handed.append(durable.step_info().token)
    raise durable.CompleteLater()


@durable.workflow(name="tests.later.slow_to_hand_flow")
def slow_to_hand_flow(ctx, _):
    return ctx.step(slow_to_hand)


def _took() -> None:
    """What the body works on; a test makes it take time."""


@pytest.mark.parametrize("in_place", [False, True], ids=["dispatched", "in place"])
def test_the_let_go_is_a_sign_of_life_the_heartbeat_timeout_counts_from(durable_env, monkeypatch, in_place):
    """A body that worked 50 s of its 1m heartbeat_timeout before raising CompleteLater leaves
    the other system the whole timeout for its first beat, not the 10 s that were left."""
    if in_place:
        monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    monkeypatch.setattr(sys.modules[__name__], "_took", lambda: durable_env._freezer.tick(50))
    run = durable.start(slow_to_hand_flow)
    durable_env.run_until_idle()
    durable_env.advance_time("55s")  # 1m45s after the attempt started, 55 s after the let-go
    assert durable.heartbeat_step(handed[0]) is True
    assert _position(run.id).status == "pending"
    durable_env.advance_time("70s")  # silent for longer than the timeout and its grace since the beat
    durable_env.run_until_idle()
    assert _position(run.id).error["code"] == "timeout"


@pytest.mark.parametrize("stall", ["30s", "90s"])
def test_a_turn_stalled_after_its_read_judges_the_attempt_as_it_read_it(durable_env, monkeypatch, stall):
    """A loaded machine stalls a turn between its read and its judgment while the other system
    beats: the attempt's silence is judged as of the read, so a beat the turn never saw is not
    overruled by a timeout (the stall reaches past the read's deadline, or past a whole timeout)."""
    run = durable.start(beaten_flow)
    durable_env.run_until_idle()
    durable_env.advance_time("40s")
    assert durable.heartbeat_step(handed[0]) is True  # silent since: its deadline is 1m40s + grace
    durable_env.advance_time("59s")
    read = histories.read

    def stalled(run_id, db):
        positions = read(run_id, db)
        durable_env._freezer.tick(parse_duration(stall, what="stall"))
        assert durable.heartbeat_step(handed[0]) is True
        return positions

    monkeypatch.setattr(histories, "read", stalled)
    lifecycle.wake(run.id)
    durable_env.run_until_idle()
    monkeypatch.setattr(histories, "read", read)
    position = _position(run.id)
    assert (position.status, position.attempt) == ("pending", 1)
    durable_env.advance_time("50s")  # within the stalled beat's timeout: still alive
    assert _position(run.id).status == "pending"
    durable.complete_step(handed[0], "done")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "done"


def test_a_beat_says_false_once_the_run_is_cancelled_with_interrupt(durable_env):
    run = durable.start(beaten_flow)
    durable_env.run_until_idle()
    durable.cancel(run.id, interrupt=True)
    assert durable.heartbeat_step(handed[0]) is False


def test_a_beat_with_a_forged_token_is_refused(durable_env):
    durable.start(beaten_flow)
    durable_env.run_until_idle()
    with pytest.raises(durable.InvalidInput):
        durable.heartbeat_step(handed[0][:-4] + "AAAA")
