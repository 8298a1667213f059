"""A cancel delivered into the body (``cancel(interrupt=True)``): ``Cancelled`` at the current
wait, recorded so every replay raises it at the same place, cleanup steps in except/finally, and
the run ends cancelled unless the body returns a value."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

import durable
from durable.replay.history import COMPLETED, FAILED

from .replaykit import RUN, T0, calls, finish_sent, stored, turn

INTERRUPT = replace(RUN, cancel_request={"reason": "user asked", "interrupt": True, "compensate": False})


@durable.step(name="tests.unit_cancel.long")
def long() -> str:
    return "long"


@durable.step(name="tests.unit_cancel.tidy")
def tidy() -> str:
    return "tidy"


@durable.step(name="tests.unit_cancel.charge", local=True)
def charge() -> str:
    calls.append("charge")
    return "charged"


@charge.compensation
def refund(charged: str) -> None:
    calls.append(f"refund {charged}")


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


def cleans_up(ctx: Any, _: Any) -> Any:
    try:
        return ctx.step(long)
    finally:
        ctx.step(tidy)


def test_cancelled_is_raised_at_the_current_wait_and_recorded_there() -> None:
    first = turn(cleans_up)
    assert first.outcome.status == "suspended"
    second = turn(cleans_up, stored(first.state.records), run=INTERRUPT)
    records = second.state.records
    assert [(records[s].kind, records[s].name) for s in sorted(records)] == [
        ("step", "tests.unit_cancel.long"),
        ("cancel", "cancel"),
        ("step", "tests.unit_cancel.tidy"),
    ]
    assert records[1].status == COMPLETED and records[1].input == {"reason": "user asked"}
    # The long step stays in flight (its heartbeat tells it); the cleanup is sent.
    assert records[0].status != COMPLETED
    assert [rec.name for rec in second.state.dispatch] == ["tests.unit_cancel.tidy"]
    assert second.outcome.status == "suspended"


def test_the_run_ends_cancelled_once_its_cleanup_ran_and_replays_identically() -> None:
    records = stored(turn(cleans_up).state.records)
    records = stored(turn(cleans_up, records, run=INTERRUPT).state.records)
    # The long step finished after all: the replay still raises Cancelled at the same place.
    assert finish_sent(records, output="x") == ["tests.unit_cancel.long", "tests.unit_cancel.tidy"]
    last = turn(cleans_up, stored(records), run=INTERRUPT)
    assert last.outcome.status == "cancelled"
    assert last.outcome.error == {
        "message": "user asked",
        "type": "Cancelled",
        "code": "cancelled",
        "details": None,
    }
    assert sorted(last.state.records) == [0, 1, 2] and last.state.dispatch == []


def test_a_body_that_catches_cancelled_and_returns_completes() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            ctx.sleep("1h")
        except durable.Cancelled as exc:
            return f"stopped: {exc.message}"
        return "slept"

    result = turn(body, run=INTERRUPT)
    assert (result.outcome.status, result.outcome.output) == ("completed", "stopped: user asked")


def test_cancelled_is_delivered_once_then_the_body_may_wait_again() -> None:
    def body(ctx: Any, _: Any) -> Any:
        with contextlib.suppress(durable.Cancelled):
            ctx.sleep("1h")
        ctx.sleep("2h")
        return "done"

    result = turn(body, run=INTERRUPT)
    assert result.outcome.status == "suspended"
    assert result.outcome.wake_at == T0 + timedelta(hours=2)
    assert [result.state.records[s].kind for s in sorted(result.state.records)] == [
        "sleep",
        "cancel",
        "sleep",
    ]
    later = turn(body, stored(result.state.records), now=T0 + timedelta(hours=3), run=INTERRUPT)
    assert (later.outcome.status, later.outcome.output) == ("completed", "done")


def test_a_primitive_that_answers_at_once_is_not_interrupted() -> None:
    def body(ctx: Any, _: Any) -> Any:
        ctx.step(charge)
        ctx.now()
        ctx.sleep("1h")

    result = turn(body, run=INTERRUPT)
    assert calls == ["charge"]
    assert [result.state.records[s].kind for s in sorted(result.state.records)] == [
        "step",
        "value",
        "sleep",
        "cancel",
    ]
    assert result.outcome.status == "cancelled"


def test_without_a_request_a_wait_suspends_as_always() -> None:
    result = turn(cleans_up)
    assert result.outcome.status == "suspended" and list(result.state.records) == [0]


def test_a_cleanup_step_that_fails_fails_the_run() -> None:
    records = stored(turn(cleans_up, run=INTERRUPT).state.records)
    tidy_rec = records[2]
    tidy_rec.status, tidy_rec.error = FAILED, {"message": "no", "type": "E", "code": None, "details": None}
    result = turn(cleans_up, stored(records), run=INTERRUPT)
    assert result.outcome.status == "failed"


def test_interrupt_with_compensate_unwinds_the_saga_once_cancelled_escapes() -> None:
    def body(ctx: Any, _: Any) -> Any:
        ctx.step(charge)
        ctx.sleep("1h")

    request = {"reason": None, "interrupt": True, "compensate": True}
    result = turn(body, run=replace(RUN, cancel_request=request))
    assert calls == ["charge", "refund charged"]
    assert result.outcome.status == "cancelled"
    assert result.outcome.error is not None and result.outcome.error["message"] == "cancelled"


def test_a_compensating_cancel_without_interrupt_runs_no_body_code() -> None:
    def body(ctx: Any, _: Any) -> Any:
        calls.append("body")
        ctx.sleep("1h")

    result = turn(body, run=replace(RUN, cancel_request={"reason": None}))
    assert result.outcome.status == "cancelled" and calls == []


def test_a_cancel_delivered_after_a_fan_replays_there_once_the_fan_closed() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            return ctx.all([ctx.defer(long), ctx.defer(long)])
        finally:
            ctx.step(tidy)

    records = stored(turn(body, run=INTERRUPT).state.records)
    assert [records[s].kind for s in sorted(records)] == ["step", "step", "cancel", "step"]
    finish_sent(records, output="x")
    last = turn(body, stored(records), run=INTERRUPT)
    assert last.outcome.status == "cancelled", last.outcome.error


def test_a_fan_member_stopped_by_the_cancel_raises_cancelled_not_gather_error() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            return ctx.all([ctx.defer(long)])
        except durable.Cancelled:
            return "cancelled"

    first = turn(body)
    records = stored(first.state.records)
    member = records[0]
    member.status, member.enqueued_at = FAILED, None
    member.error = {"message": "stop", "type": "StepCancelled", "code": "cancelled", "details": None}
    result = turn(body, stored(records), run=INTERRUPT)
    assert (result.outcome.status, result.outcome.output) == ("completed", "cancelled")
    assert result.state.records[1].kind == "cancel"


def test_a_wait_that_ended_before_the_cancel_came_still_takes_it_and_the_cleanup_runs() -> None:
    """The step the run was suspended on completed, then the cancel came, before the next turn:
    ``Cancelled`` is raised at that step (where the run was), not at the cleanup step in
    ``finally``, which would then be recorded and never run."""
    records = stored(turn(cleans_up).state.records)
    assert finish_sent(records, output="long") == ["tests.unit_cancel.long"]
    second = turn(cleans_up, stored(records), run=INTERRUPT)
    taken = second.state.records
    assert [(taken[s].kind, taken[s].name) for s in sorted(taken)] == [
        ("step", "tests.unit_cancel.long"),
        ("cancel", "cancel"),
        ("step", "tests.unit_cancel.tidy"),
    ]
    assert [rec.name for rec in second.state.dispatch] == ["tests.unit_cancel.tidy"]
    assert second.outcome.status == "suspended"
    done = stored(taken)
    assert finish_sent(done, output="tidy") == ["tests.unit_cancel.tidy"]
    last = turn(cleans_up, stored(done), run=INTERRUPT)
    assert last.outcome.status == "cancelled"
