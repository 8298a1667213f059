"""Unit tests for durable.replay.core.replay(): steps, non-determinism and how the body ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

import durable
from durable.definitions import Workflow
from durable.errors import ApplicationError, NonDeterminismError, StepFailed, _ControlFlow
from durable.replay.attempt import beat_grace
from durable.replay.context import TurnState
from durable.replay.core import replay
from durable.replay.history import COMPLETED, FAILED, PENDING, Record

from .replaykit import LIMITS, RUN, T0, beating, calls, done, flaky, once, other, pair, remote, turn


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


# -- remote steps --------------------------------------------------------------------------


def test_new_remote_step_is_dispatched_and_the_run_suspends() -> None:
    t = turn(lambda ctx, inp: ctx.step(remote, 4))
    rec = t.state.records[0]
    assert t.outcome.status == "suspended"
    assert t.state.dispatch == [rec]
    assert (rec.kind, rec.name, rec.status) == ("step", "tests.unit_replay.remote", PENDING)
    assert rec.input == {"args": [4], "kwargs": {}}
    assert rec.queue == "tests-unit-queue"
    assert rec.enqueued_at == T0
    assert t.outcome.wake_at == T0 + LIMITS.redispatch_after
    assert calls == []


def test_completed_step_replays_its_output_without_calling_the_function() -> None:
    t = turn(lambda ctx, inp: ctx.step(remote, 4), [done(0, "tests.unit_replay.remote", 99)])
    assert t.outcome.status == "completed"
    assert t.outcome.output == 99
    assert calls == []
    assert t.state.dispatch == []


def _failed_step(seq: int = 0) -> Record:
    error = {"message": "card declined", "type": "ApplicationError", "code": "declined", "details": {"n": 1}}
    return Record(seq=seq, kind="step", name="tests.unit_replay.remote", status=FAILED, error=error)


def test_failed_step_raises_step_failed_carrying_recorded_message_and_code() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        try:
            ctx.step(remote, 4)
        except StepFailed as exc:
            return [exc.message, exc.code, exc.details]
        return "not raised"

    assert turn(body, [_failed_step()]).outcome.output == ["card declined", "declined", {"n": 1}]


def test_uncaught_step_failure_fails_the_run_naming_the_failed_position() -> None:
    outcome = turn(lambda ctx, inp: ctx.step(remote, 4), [_failed_step()]).outcome
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error["type"] == "StepFailed"
    assert outcome.error["code"] == "declined"
    assert outcome.error["message"] == "card declined"
    assert outcome.failed_seqs == [0]


def _started(attempt: int, *, started_ago: timedelta) -> Record:
    at = T0 - started_ago
    return Record(
        seq=0, kind="step", name="tests.unit_replay.remote", attempt=attempt, enqueued_at=at, started_at=at
    )


def test_started_step_within_its_timeout_waits_until_the_deadline() -> None:
    t = turn(lambda ctx, inp: ctx.step(remote, 4), [_started(1, started_ago=timedelta(seconds=10))])
    assert t.outcome.status == "suspended"
    assert t.outcome.wake_at == T0 - timedelta(seconds=10) + timedelta(minutes=1) + LIMITS.timeout_grace
    assert t.state.dispatch == []


def test_step_past_timeout_and_grace_schedules_a_retry() -> None:
    t = turn(lambda ctx, inp: ctx.step(remote, 4), [_started(1, started_ago=timedelta(minutes=2))])
    rec = t.state.records[0]
    assert t.outcome.status == "suspended"
    assert rec.status == PENDING
    assert rec.attempt == 2
    assert rec.error is not None and rec.error["code"] == "timeout"
    assert rec.enqueued_at is None and rec.started_at is None
    assert rec.wake_at is not None and rec.wake_at > T0
    assert t.outcome.wake_at == rec.wake_at
    assert t.state.dispatch == []


def test_step_past_timeout_on_last_attempt_raises_step_failed() -> None:
    outcome = turn(
        lambda ctx, inp: ctx.step(remote, 4), [_started(3, started_ago=timedelta(minutes=2))]
    ).outcome
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert (outcome.error["type"], outcome.error["code"]) == ("StepFailed", "timeout")
    assert outcome.failed_seqs == [0]


def test_step_waiting_out_its_backoff_is_sent_once_the_backoff_has_passed() -> None:
    rec = Record(
        seq=0, kind="step", name="tests.unit_replay.remote", attempt=2, wake_at=T0 - timedelta(seconds=1)
    )
    t = turn(lambda ctx, inp: ctx.step(remote, 4), [rec])
    assert t.state.dispatch == [rec]
    assert rec.enqueued_at == T0


def test_enqueued_step_never_started_within_redispatch_after_is_sent_again() -> None:
    enqueued = T0 - LIMITS.redispatch_after - timedelta(seconds=1)
    rec = Record(seq=0, kind="step", name="tests.unit_replay.remote", enqueued_at=enqueued)
    t = turn(lambda ctx, inp: ctx.step(remote, 4), [rec])
    assert t.outcome.status == "suspended"
    assert t.state.dispatch == [rec]
    assert rec.enqueued_at == T0
    assert rec.dirty


def test_enqueued_step_within_redispatch_after_is_not_sent_again() -> None:
    rec = Record(seq=0, kind="step", name="tests.unit_replay.remote", enqueued_at=T0 - timedelta(seconds=30))
    t = turn(lambda ctx, inp: ctx.step(remote, 4), [rec])
    assert t.state.dispatch == []
    assert t.outcome.wake_at == T0 + timedelta(seconds=30)


def _beating(last_beat_ago: timedelta) -> Record:
    started = T0 - timedelta(minutes=1)
    return Record(
        seq=0,
        kind="step",
        name="tests.unit_replay.beating",
        enqueued_at=started,
        started_at=started,
        last_heartbeat_at=T0 - last_beat_ago,
    )


def test_step_silent_past_heartbeat_timeout_and_grace_schedules_a_retry() -> None:
    rec = _beating(last_beat_ago=timedelta(seconds=11, milliseconds=1))
    turn(lambda ctx, inp: ctx.step(beating), [rec])
    assert rec.attempt == 2
    assert rec.error is not None and rec.error["type"] == "StepTimeout"


def test_step_that_beat_recently_waits_for_its_heartbeat_deadline() -> None:
    t = turn(lambda ctx, inp: ctx.step(beating), [_beating(last_beat_ago=timedelta(seconds=5))])
    # heartbeat_timeout 10 s + a grace of 1 s, not + the 10 s persist throttle.
    assert t.outcome.wake_at == T0 + timedelta(seconds=6)
    assert t.state.records[0].attempt == 1


def _held(lapses_in: timedelta) -> Record:
    """A beating attempt whose worker process holds it until ``lapses_in`` from now."""
    return replace(_beating(last_beat_ago=timedelta(0)), held_by="w1/p1", held_until=T0 + lapses_in)


def _unsent(sent_ago: timedelta) -> Record:
    return Record(seq=0, kind="step", name="tests.unit_replay.remote", enqueued_at=T0 - sent_ago)


def _step_of(record: Record) -> Callable[[Any, Any], Any]:
    if record.name == remote.name:
        return lambda ctx, inp: ctx.step(remote, 1)
    return lambda ctx, inp: ctx.step(beating)


@pytest.mark.parametrize(
    ("record", "verdict"),
    [
        (_beating(last_beat_ago=timedelta(seconds=5)), "StepTimeout"),
        (_held(lapses_in=timedelta(seconds=5)), "WorkerLost"),
        (_unsent(sent_ago=timedelta(seconds=30)), "sent again"),
    ],
    ids=["a beat", "a hold", "a message"],
)
def test_a_turn_stalled_after_its_read_judges_what_it_read_as_of_the_read(record, verdict) -> None:
    """The turn read the attempt at T0 and reaches its judgment a minute later: the beats, hold
    renewals and takes of that minute are not in the record, so nothing it says is judged past
    T0 (the run looks again by the record's own deadline, and the next turn reads them)."""
    stalled = T0 + timedelta(minutes=1)
    t = turn(_step_of(record), [record], now=stalled, read_at=T0)
    assert (record.attempt, record.error, t.state.dispatch) == (1, None, [])
    assert t.outcome.wake_at is not None and T0 < t.outcome.wake_at <= stalled
    # Read as late as it is judged, the same record is overdue.
    again = turn(_step_of(record), [record], now=stalled, read_at=stalled)
    if verdict == "sent again":
        assert again.state.dispatch == [record] and record.enqueued_at == stalled
    else:
        assert record.attempt == 2 and record.error is not None and record.error["type"] == verdict


@pytest.mark.parametrize(
    ("timeout", "throttle", "grace"),
    [
        (timedelta(seconds=2), timedelta(seconds=10), timedelta(milliseconds=250)),
        (timedelta(seconds=30), timedelta(seconds=10), timedelta(seconds=1)),
        (timedelta(seconds=30), timedelta(milliseconds=200), timedelta(milliseconds=200)),
    ],
)
def test_the_heartbeat_grace_is_at_most_a_second_whatever_the_throttle(timeout, throttle, grace) -> None:
    assert beat_grace(timeout, throttle) == grace


# -- local steps ---------------------------------------------------------------------------


def test_local_step_runs_inline_flushes_and_returns_its_output_as_stored() -> None:
    t = turn(lambda ctx, inp: ctx.step(pair, 1, 2))
    assert t.outcome.status == "completed"
    assert t.outcome.output == {"__durable__": "tuple", "v": [1, 2]}  # the body got the tuple
    assert t.state.records[0].status == COMPLETED
    assert t.state.dispatch == []
    assert t.flushes == [t.state]


def test_local_step_heartbeat_renews_the_lease() -> None:
    assert len(turn(lambda ctx, inp: ctx.step(pair, 1, 2)).renews) == 1


def test_local_step_that_raises_with_retries_left_stays_pending_until_its_backoff() -> None:
    t = turn(lambda ctx, inp: ctx.step(flaky))
    rec = t.state.records[0]
    assert t.outcome.status == "suspended"
    assert rec.status == PENDING
    assert rec.attempt == 2
    assert rec.error is not None and rec.error["message"] == "flaky failed"
    assert rec.wake_at is not None
    assert T0 + timedelta(seconds=10) <= rec.wake_at <= T0 + timedelta(seconds=12)
    assert t.outcome.wake_at == rec.wake_at
    assert len(t.flushes) == 1


def test_local_step_past_its_backoff_runs_again_with_the_next_attempt() -> None:
    rec = Record(seq=0, kind="step", name="tests.unit_replay.flaky", attempt=2, wake_at=T0, input={})
    turn(lambda ctx, inp: ctx.step(flaky), [rec])
    assert calls == ["flaky attempt 2"]
    assert rec.attempt == 3


def test_local_step_out_of_attempts_fails_the_run_with_its_error_code() -> None:
    outcome = turn(lambda ctx, inp: ctx.step(once)).outcome
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert (outcome.error["type"], outcome.error["code"]) == ("StepFailed", "declined")
    assert outcome.failed_seqs == [0]


# -- non-determinism -----------------------------------------------------------------------


def test_different_step_name_raises_non_determinism_error_naming_both() -> None:
    seen: list[NonDeterminismError] = []

    def body(ctx: durable.Context, inp: Any) -> Any:
        try:
            return ctx.step(other)
        except NonDeterminismError as exc:
            seen.append(exc)
            raise

    turn(body, [done(0, "tests.unit_replay.remote", 1)])
    assert "'tests.unit_replay.remote'" in seen[0].message
    assert "'tests.unit_replay.other'" in seen[0].message


def test_non_determinism_fails_the_run_even_when_the_body_catches_it() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        try:
            return ctx.step(other)
        except NonDeterminismError:
            return "swallowed"

    outcome = turn(body, [done(0, "tests.unit_replay.remote", 1)]).outcome
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert (outcome.error["type"], outcome.error["code"]) == ("NonDeterminismError", "non_determinism")


def test_different_primitive_kind_at_a_position_is_non_determinism() -> None:
    sleep = Record(seq=0, kind="sleep", name="sleep", status=COMPLETED)
    outcome = turn(lambda ctx, inp: ctx.step(remote, 1), [sleep]).outcome
    assert outcome.error is not None
    assert outcome.error["code"] == "non_determinism"
    assert "sleep 'sleep'" in outcome.error["message"]
    assert "step 'tests.unit_replay.remote'" in outcome.error["message"]
    assert calls == []


@durable.step(name="tests.unit_replay.booked", local=True)
def booked() -> str:
    return "booked"


@booked.compensation
def unbook(out: str) -> None:
    calls.append(f"undo {out}")


def test_non_determinism_parks_by_default_with_nothing_compensated_even_when_caught() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        ctx.step(booked)
        try:
            return ctx.step(other)
        except NonDeterminismError:
            raise ValueError("the body failed on its own") from None

    history = [done(0, booked.name, "booked"), done(1, "tests.unit_replay.remote", 1)]
    t = turn(body, history)
    assert t.outcome.blocked
    assert t.outcome.error is not None and t.outcome.error["code"] == "non_determinism"
    assert calls == [] and not t.state.unsaved()  # no compensation ran or was recorded


def test_non_determinism_fails_and_compensates_when_the_limits_say_fail() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        ctx.step(booked)
        try:
            return ctx.step(other)
        except NonDeterminismError:
            raise ValueError("the body failed on its own") from None

    history = [done(0, booked.name, "booked"), done(1, "tests.unit_replay.remote", 1)]
    t = turn(body, history, limits=replace(LIMITS, park_nondeterminism=False))
    assert not t.outcome.blocked
    assert (t.outcome.status, t.outcome.error["code"]) == ("failed", "non_determinism")
    assert calls == ["undo booked"]


def test_the_error_says_what_the_body_asked_for_and_the_causes_without_claiming_a_change() -> None:
    outcome = turn(lambda ctx, inp: ctx.step(other), [done(0, "tests.unit_replay.remote", 1)]).outcome
    message = outcome.error["message"]
    assert message.startswith(
        "at position 0 the workflow asked for step 'tests.unit_replay.other' where its history holds "
        "step 'tests.unit_replay.remote'"
    )
    assert "either the workflow code changed" in message and "not deterministic" in message
    for cause_or_fix in (
        "random",
        "the clock",
        "set",
        "ctx.random()",
        "ctx.now()",
        "sorted()",
        "ctx.patched()",
    ):
        assert cause_or_fix in message


# -- how the body ends ---------------------------------------------------------------------


def test_application_error_escaping_the_body_gives_its_code() -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        raise ApplicationError("out of stock", code="stock", details={"sku": "A1"})

    outcome = turn(body).outcome
    assert outcome.status == "failed"
    assert outcome.error == {
        "message": "out of stock",
        "type": "ApplicationError",
        "code": "stock",
        "details": {"sku": "A1"},
    }
    assert outcome.failed_seqs == []


def test_plain_exception_escaping_the_body_has_no_code() -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        raise KeyError("sku")

    outcome = turn(body).outcome
    assert outcome.error is not None
    assert (outcome.error["type"], outcome.error["code"]) == ("KeyError", None)


def test_non_json_return_value_fails_with_invalid_output() -> None:
    outcome = turn(lambda ctx, inp: {"ids": object()}).outcome
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error["code"] == "invalid_output"
    assert "tests.unit_replay.wf" in outcome.error["message"]


def test_return_value_is_stored_as_tagged_json() -> None:
    assert turn(lambda ctx, inp: {"pair": (1, 2), 3: "x"}).outcome.output == {
        "pair": {"__durable__": "tuple", "v": [1, 2]},
        "3": "x",
    }


def test_control_flow_exception_from_flush_propagates_out_of_replay() -> None:
    class LeaseGone(_ControlFlow):
        pass

    def flush(state: TurnState) -> None:
        raise LeaseGone()

    state = TurnState(records={}, signals=[])
    body = Workflow(fn=lambda ctx, inp: ctx.step(pair, 1, 2), name=RUN.workflow)
    with pytest.raises(LeaseGone):
        replay(body, RUN, state, clock=lambda: T0, limits=LIMITS, flush=flush, renew=lambda: None)
