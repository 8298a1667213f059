"""Unit tests for durable.replay.core.replay(): timers, signals, recorded values, patches, facts."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

import durable
from durable.errors import WaitTimeout
from durable.replay.history import COMPLETED, FAILED, BufferedSignal, Record

from .replaykit import LIMITS, T0, calls, done, other, pair, remote, turn


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


# -- timers and signals --------------------------------------------------------------------


def test_new_sleep_suspends_until_its_wake_at() -> None:
    t = turn(lambda ctx, inp: ctx.sleep("1h"))
    assert t.outcome.status == "suspended"
    assert t.state.records[0].wake_at == T0 + timedelta(hours=1)
    assert t.outcome.wake_at == T0 + timedelta(hours=1)


def test_sleep_replayed_at_its_wake_at_completes() -> None:
    rec = Record(seq=0, kind="sleep", name="sleep", wake_at=T0)
    t = turn(lambda ctx, inp: ctx.sleep("1h") or "woke", [rec])
    assert t.outcome.output == "woke"
    assert rec.status == COMPLETED


def test_suspended_run_wakes_no_later_than_the_reconcile_interval() -> None:
    assert turn(lambda ctx, inp: ctx.sleep("30d")).outcome.wake_at == T0 + LIMITS.reconcile_interval


def test_buffered_signal_is_consumed_and_its_payload_returned() -> None:
    sig = BufferedSignal(id=7, name="approval", payload={"ok": True})
    ignored = BufferedSignal(id=8, name="other", payload=None)
    t = turn(lambda ctx, inp: ctx.wait_for_signal("approval"), signals=[ignored, sig])
    assert t.outcome.output == {"ok": True}
    assert sig.consumed_seq == 0
    assert ignored.consumed_seq is None
    assert t.state.consumed == [sig]


def test_signal_wait_without_a_signal_suspends_until_the_timeout() -> None:
    t = turn(lambda ctx, inp: ctx.wait_for_signal("approval", timeout="1h"))
    assert t.outcome.status == "suspended"
    assert t.outcome.wake_at == T0 + timedelta(hours=1)
    assert t.state.records[0].input == {"timeout": 3600.0}


def _signal_wait(wake_at: datetime) -> Record:
    return Record(seq=0, kind="signal", name="approval", input={"timeout": 3600.0}, wake_at=wake_at)


def test_signal_wait_before_its_timeout_stays_suspended() -> None:
    t = turn(
        lambda ctx, inp: ctx.wait_for_signal("approval", timeout="1h"),
        [_signal_wait(T0 + timedelta(minutes=30))],
    )
    assert t.outcome.status == "suspended"


def test_signal_wait_past_its_timeout_raises_wait_timeout() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        try:
            ctx.wait_for_signal("approval", timeout="1h")
        except WaitTimeout as exc:
            return ["timed out", exc.code, isinstance(exc, TimeoutError)]

    t = turn(body, [_signal_wait(T0)])
    assert t.outcome.output == ["timed out", "timeout", True]
    assert t.state.records[0].status == FAILED


def test_recorded_signal_timeout_replays_as_wait_timeout_failing_the_run() -> None:
    rec = Record(seq=0, kind="signal", name="approval", status=FAILED, error=WaitTimeout("late").to_dict())
    outcome = turn(lambda ctx, inp: ctx.wait_for_signal("approval", timeout="1h"), [rec]).outcome
    assert outcome.error is not None
    assert (outcome.error["type"], outcome.error["code"]) == ("WaitTimeout", "timeout")
    assert outcome.failed_seqs == [0]


def test_signal_wait_with_zero_timeout_records_json_input() -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        try:
            ctx.wait_for_signal("approval", timeout=0)
        except Exception:  # noqa: BLE001 - only the recorded input matters here
            return None

    assert turn(body).state.records[0].input == {"timeout": 0.0}


# -- recorded values -----------------------------------------------------------------------


def _values(ctx: durable.Context, inp: Any) -> list[Any]:
    return [ctx.now(), ctx.uuid4(), ctx.random()]


def test_now_uuid4_and_random_return_typed_values() -> None:
    seen: list[Any] = []
    turn(lambda ctx, inp: seen.extend(_values(ctx, inp)))
    now, uid, rnd = seen
    assert now == T0
    assert isinstance(uid, uuid.UUID)
    assert isinstance(rnd, float) and 0.0 <= rnd < 1.0


def test_now_uuid4_and_random_are_recorded_as_value_positions() -> None:
    t = turn(lambda ctx, inp: _values(ctx, inp) and None)
    assert [(r.kind, r.name, r.status) for r in t.state.records.values()] == [
        ("value", "now", COMPLETED),
        ("value", "uuid4", COMPLETED),
        ("value", "random", COMPLETED),
    ]


def test_now_uuid4_and_random_replay_the_same_values_later() -> None:
    first: list[Any] = []
    second: list[Any] = []
    t = turn(lambda ctx, inp: first.extend(_values(ctx, inp)))
    turn(lambda ctx, inp: second.extend(_values(ctx, inp)), t.state.records, now=T0 + timedelta(days=3))
    assert second == first
    assert isinstance(second[0], datetime) and isinstance(second[1], uuid.UUID)


# -- patching, replay flag, facts ----------------------------------------------------------


def test_patched_on_a_new_run_records_a_marker_and_returns_true() -> None:
    t = turn(lambda ctx, inp: ctx.patched("tests.unit_change"))
    assert t.outcome.output is True
    rec = t.state.records[0]
    assert (rec.kind, rec.name, rec.status) == ("patch", "tests.unit_change", COMPLETED)


def test_patched_replayed_over_its_marker_returns_true() -> None:
    marker = done(0, "tests.unit_change", None, kind="patch")
    assert turn(lambda ctx, inp: ctx.patched("tests.unit_change"), [marker]).outcome.output is True


def test_patched_on_old_history_returns_false_without_consuming_the_position() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        if ctx.patched("tests.unit_change"):
            return ctx.step(other)
        return ctx.step(remote, 1)

    t = turn(body, [done(0, "tests.unit_replay.remote", 10)])
    assert t.outcome.output == 10
    assert list(t.state.records) == [0]


def test_is_replaying_is_true_over_recorded_positions_then_false() -> None:
    flags: list[bool] = []

    def body(ctx: durable.Context, inp: Any) -> Any:
        flags.append(ctx.is_replaying)
        ctx.step(remote, 1)
        flags.append(ctx.is_replaying)
        ctx.step(pair, 1, 2)
        flags.append(ctx.is_replaying)

    turn(body, [done(0, "tests.unit_replay.remote", 10)])
    assert flags == [True, False, False]


def test_context_exposes_the_facts_of_the_run() -> None:
    t = turn(lambda ctx, inp: [ctx.run_id, ctx.workflow_name, ctx.version, ctx.namespace, inp])
    assert t.outcome.output == ["run-1", "tests.unit_replay.wf", "1", None, {"n": 1}]
