"""Unit tests of replay(): ``ctx.wait_for_message``, signals and updates of several names handled in
whatever order they arrive, each update answerable."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import durable
from durable.replay.history import COMPLETED, FAILED, BufferedSignal, Record

from .replaykit import T0, done, turn


def _update(id: int, name: str, payload: Any) -> BufferedSignal:
    return BufferedSignal(id=id, name=name, payload=payload, update=True)


def _signal(id: int, name: str, payload: Any) -> BufferedSignal:
    return BufferedSignal(id=id, name=name, payload=payload)


def cart(ctx: durable.Context, _: Any) -> list[Any]:
    """Add and remove items (updates, each answered) until "checkout" (a signal)."""
    items: list[Any] = []
    while True:
        message = ctx.wait_for_message(signals=["checkout"], updates=["add", "remove"])
        if isinstance(message, durable.Signal):
            return [*items, message.payload]
        if message.name == "add":
            items.append(message.payload)
        else:
            items.remove(message.payload)
        ctx.reply(message, len(items))


def kinds(records: dict[int, Record]) -> list[tuple[str, str, Any]]:
    return [(r.kind, r.name, r.output) for r in sorted(records.values(), key=lambda r: r.seq)]


def test_signals_and_updates_of_several_names_are_taken_oldest_first_each_update_answered() -> None:
    arrived = [_update(1, "add", "tea"), _update(2, "add", "jam"), _update(3, "remove", "tea")]
    arrived.append(_signal(4, "checkout", "card"))
    t = turn(cart, signals=arrived)
    assert (t.outcome.status, t.outcome.output) == ("completed", ["jam", "card"])
    assert kinds(t.state.records) == [
        ("message", "checkout|add|remove", {"id": 1, "name": "add", "payload": "tea"}),
        ("reply", "add", 1),
        ("message", "checkout|add|remove", {"id": 2, "name": "add", "payload": "jam"}),
        ("reply", "add", 2),
        ("message", "checkout|add|remove", {"id": 3, "name": "remove", "payload": "tea"}),
        ("reply", "remove", 1),
        ("message", "checkout|add|remove", {"name": "checkout", "payload": "card"}),
    ]
    assert [r.input for r in t.state.records.values() if r.kind == "reply"] == [
        {"update": 1},
        {"update": 2},
        {"update": 3},
    ]
    assert [s.consumed_seq for s in arrived] == [0, 2, 4, 6]


def test_the_same_history_replays_to_the_same_signals_and_updates_and_records_nothing_new() -> None:
    first = turn(cart, signals=[_update(1, "add", "tea"), _signal(2, "checkout", "cash")])
    again = turn(cart, first.state.records)
    assert (again.outcome.status, again.outcome.output) == ("completed", ["tea", "cash"])
    assert kinds(again.state.records) == kinds(first.state.records)
    assert not again.state.consumed


def test_a_body_receives_a_durable_signal_or_a_durable_update_on_every_turn() -> None:
    seen: list[Any] = []

    def body(ctx: durable.Context, _: Any) -> None:
        seen.append(ctx.wait_for_message(signals=["go"], updates=["ask"]))
        seen.append(ctx.wait_for_message(signals=["go"], updates=["ask"]))
        ctx.reply(seen[-1], "ok")

    first = turn(body, signals=[_signal(5, "go", {"n": 1}), _update(6, "ask", [1, 2])])
    turn(body, first.state.records)
    assert seen == [durable.Signal("go", {"n": 1}), durable.Update(6, "ask", [1, 2])] * 2


def test_an_update_is_never_taken_as_a_signal_nor_a_signal_as_an_update() -> None:
    update_named_like_a_signal = _update(1, "go", "u")
    signal_named_like_an_update = _signal(2, "ask", "s")
    t = turn(
        lambda ctx, _: ctx.wait_for_message(signals=["go"], updates=["ask"], timeout="1h"),
        signals=[update_named_like_a_signal, signal_named_like_an_update],
    )
    assert (t.outcome.status, t.outcome.wake_at) == ("suspended", T0 + timedelta(hours=1))
    assert (
        update_named_like_a_signal.consumed_seq is None and signal_named_like_an_update.consumed_seq is None
    )


def test_a_name_under_both_takes_either_kind_as_its_own() -> None:
    def body(ctx: durable.Context, _: Any) -> list[Any]:
        both = [ctx.wait_for_message(signals=["note"], updates=["note"]) for _ in range(2)]
        return [f"{type(message).__name__}: {message.payload}" for message in both]

    t = turn(body, signals=[_update(1, "note", "as update"), _signal(2, "note", "as signal")])
    assert t.outcome.output == ["Update: as update", "Signal: as signal"]
    assert [r.name for r in t.state.records.values()] == ["note", "note"]


def test_past_its_timeout_the_wait_raises_wait_timeout_naming_the_names() -> None:
    def body(ctx: durable.Context, _: Any) -> str:
        try:
            ctx.wait_for_message(signals=["go"], updates=["ask"], timeout="1h")
        except durable.WaitTimeout as exc:
            return str(exc)
        return "received"

    waiting = turn(body)
    assert waiting.outcome.status == "suspended"
    late = turn(body, waiting.state.records, now=T0 + timedelta(hours=1))
    assert late.outcome.output == "no signal of ['go'] nor update of ['ask'] arrived before the timeout"
    assert late.state.records[0].status == FAILED


def test_a_reply_to_a_signal_is_refused() -> None:
    def body(ctx: durable.Context, _: Any) -> None:
        ctx.reply(ctx.wait_for_message(signals=["go"]), "no")

    outcome = turn(body, signals=[_signal(1, "go", None)]).outcome
    assert outcome.status == "failed"
    assert "answers the durable.Update" in outcome.error["message"]


def test_a_reply_to_an_update_received_elsewhere_is_refused_and_one_taken_here_is_not() -> None:
    received = done(0, "ask", {"id": 7, "name": "ask", "payload": 1}, kind="message")
    answered = turn(lambda ctx, _: ctx.reply(ctx.wait_for_message(updates=["ask"]), 2), [received])
    assert answered.outcome.status == "completed"
    assert [(r.kind, r.input) for r in answered.state.records.values()][1] == ("reply", {"update": 7})
    forged = turn(lambda ctx, _: ctx.reply(durable.Update(8, "ask", 1), 2), [received])
    assert "has not received" in forged.outcome.error["message"]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({}, "needs at least one name to wait for"),
        ({"signals": "go"}, "takes a list of signal names"),
        ({"updates": ["ask", ""]}, "needs non-empty update names"),
        ({"signals": ["x" * 200], "updates": ["y" * 60]}, "at most 255 fit"),
    ],
)
def test_names_it_cannot_wait_for_fail_the_run_saying_what_to_pass(kwargs: dict[str, Any], says: str) -> None:
    outcome = turn(lambda ctx, _: ctx.wait_for_message(**kwargs)).outcome
    assert outcome.status == "failed" and outcome.error is not None
    assert "ctx.wait_for_message()" in outcome.error["message"] and says in outcome.error["message"]


def test_an_async_body_awaits_it_in_call_order() -> None:
    async def body(ctx: Any, _: Any) -> list[Any]:
        first = await ctx.wait_for_message(updates=["add"])
        ctx.reply(first, "added")
        second = await ctx.wait_for_message(signals=["stop"], updates=["add"])
        return [first.payload, second.name]

    t = turn(body, signals=[_signal(1, "stop", None), _update(2, "add", "tea")])
    assert (t.outcome.status, t.outcome.output) == ("completed", ["tea", "stop"])
    assert [r.kind for r in t.state.records.values()] == ["message", "reply", "message"]
    assert t.state.records[0].status == COMPLETED
