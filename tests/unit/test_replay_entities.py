"""Unit tests of ctx.signal_entity / ctx.call_entity in replay(): what they record, and how they
replay, with no database."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable.replay.entity_calls import entity_op_id
from durable.replay.history import COMPLETED, FAILED, PENDING, Record

from .replaykit import RUN, T0, turn


@durable.entity("tests.unit_counter")
class Counter:
    def initial_state(self):
        return {"n": 0}

    def add(self, state, k):
        state["n"] += k
        return state["n"]


def calls_twice(ctx, _):
    ctx.signal_entity("tests.unit_counter", "a", "add", 1)
    return ctx.call_entity("tests.unit_counter", "a", "add", 2, timeout="1m")


def entity_rec(seq, status=PENDING, **fields):
    return Record(
        seq=seq, kind="entity", name="tests.unit_counter:add", status=status, stored_as=(status, 1), **fields
    )


def test_a_signal_is_recorded_done_and_a_call_waits_with_its_op_id_and_timeout() -> None:
    t = turn(calls_twice)
    assert t.outcome.status == "suspended"
    signal, call = t.state.records[0], t.state.records[1]
    assert (signal.kind, signal.name, signal.status) == ("entity", "tests.unit_counter:add", COMPLETED)
    assert signal.input == {
        "entity": "tests.unit_counter",
        "key": "a",
        "op": "add",
        "arg": 1,
        "op_id": entity_op_id(RUN.id, 0),
        "call": False,
        "timeout": None,
    }
    assert call.status == PENDING and call.input["call"] is True and call.input["op_id"] == f"run:{RUN.id}:1"
    assert call.wake_at == T0 + timedelta(minutes=1)
    assert t.outcome.wake_at == T0 + timedelta(minutes=1)


def test_recorded_positions_replay_without_recording_anything_new() -> None:
    records = [entity_rec(0, COMPLETED), entity_rec(1, COMPLETED, output=3)]
    t = turn(calls_twice, records)
    assert t.outcome.output == 3
    assert t.state.unsaved() == []


def test_a_failed_op_raises_step_failed_with_its_error() -> None:
    error = {"message": "nope", "type": "ApplicationError", "code": "nope", "details": None}
    t = turn(calls_twice, [entity_rec(0, COMPLETED), entity_rec(1, FAILED, error=error)])
    assert t.outcome.status == "failed"
    assert t.outcome.error["type"] == "StepFailed" and t.outcome.error["code"] == "nope"


def test_a_call_past_its_timeout_raises_wait_timeout() -> None:
    t = turn(calls_twice, [entity_rec(0, COMPLETED), entity_rec(1, wake_at=T0)], now=T0)
    assert t.outcome.status == "failed"
    assert t.outcome.error["type"] == "WaitTimeout"


def test_another_primitive_at_an_entity_position_is_non_determinism() -> None:
    t = turn(lambda ctx, _: ctx.sleep("1s"), [entity_rec(0, COMPLETED)])
    assert t.outcome.error["type"] == "NonDeterminismError"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (lambda ctx, _: ctx.call_entity("tests.unit_nope", "a", "add"), "no entity is registered"),
        (lambda ctx, _: ctx.call_entity("tests.unit_counter", "a", "sub"), "has no operation 'sub'"),
        (lambda ctx, _: ctx.signal_entity("tests.unit_counter", "", "add"), "key"),
        (lambda ctx, _: ctx.signal_entity("tests.unit_counter", "a", "add", object()), "argument"),
        (lambda ctx, _: ctx.call_entity("tests.unit_counter", "a", "add", timeout="soon"), "timeout"),
    ],
)
def test_bad_input_fails_the_run_clearly_and_sends_nothing(body, says) -> None:
    t = turn(body)
    assert t.outcome.status == "failed"
    assert t.outcome.error["type"] == "InvalidInput" and says in t.outcome.error["message"]
    assert not [r for r in t.state.records.values() if r.kind == "entity"]


def test_the_decorator_refuses_a_class_without_initial_state_and_bad_versions() -> None:
    with pytest.raises(durable.InvalidInput, match="initial_state"):
        durable.entity("tests.unit_bad")(type("NoInitial", (), {"op": lambda self, s, a: None}))
    with pytest.raises(durable.InvalidInput, match="version"):
        durable.entity("tests.unit_bad", version="two")
    with pytest.raises(durable.InvalidInput, match="name"):
        durable.entity("")
