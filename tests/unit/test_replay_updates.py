"""Unit tests of replay(): updates and replies, waiting for any of several signals, exposed values."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

import durable
from durable.errors import WaitTimeout
from durable.replay.history import COMPLETED, FAILED, BufferedSignal, Record

from .replaykit import LIMITS, T0, done, turn


def _update(id: int, name: str, payload: Any) -> BufferedSignal:
    return BufferedSignal(id=id, name=name, payload=payload, update=True)


def _received(seq: int, id: int, name: str, payload: Any) -> Record:
    return done(seq, name, {"id": id, "name": name, "payload": payload}, kind="update")


def _answer(ctx: durable.Context, inp: Any) -> Any:
    update = ctx.wait_for_update("rename")
    ctx.reply(update, {"renamed": update.payload})
    return update.payload


# -- waiting for an update ----------------------------------------------------------------


def test_wait_for_update_takes_the_oldest_update_of_its_name_as_an_update() -> None:
    plain = BufferedSignal(id=1, name="rename", payload="a plain signal")
    other = _update(2, "resize", 3)
    wanted = _update(3, "rename", "ann")
    t = turn(lambda ctx, inp: ctx.wait_for_update("rename").payload, signals=[plain, other, wanted])
    assert t.outcome.output == "ann"
    rec = t.state.records[0]
    assert (rec.kind, rec.name, rec.status) == ("update", "rename", COMPLETED)
    assert rec.output == {"id": 3, "name": "rename", "payload": "ann"}
    assert t.state.consumed == [wanted]
    assert plain.consumed_seq is None and other.consumed_seq is None


def test_wait_for_update_returns_a_durable_update_on_the_first_turn_and_on_replays() -> None:
    seen: list[Any] = []

    def body(ctx: durable.Context, inp: Any) -> None:
        seen.append(ctx.wait_for_update("rename"))

    turn(body, signals=[_update(3, "rename", {"to": "ann"})])
    turn(body, [_received(0, 3, "rename", {"to": "ann"})])
    assert seen == [durable.Update(3, "rename", {"to": "ann"})] * 2


def test_a_signal_wait_takes_an_update_as_a_signal_of_its_name() -> None:
    t = turn(lambda ctx, inp: ctx.wait_for_signal("rename"), signals=[_update(3, "rename", "ann")])
    assert t.outcome.output == "ann"


def test_wait_for_update_without_one_suspends_until_its_timeout_then_raises() -> None:
    t = turn(lambda ctx, inp: ctx.wait_for_update("rename", timeout="1h"))
    assert (t.outcome.status, t.outcome.wake_at) == ("suspended", T0 + timedelta(hours=1))

    def body(ctx: durable.Context, inp: Any) -> Any:
        try:
            ctx.wait_for_update("rename", timeout="1h")
        except WaitTimeout as exc:
            return str(exc)

    late = turn(body, t.state.records, now=T0 + timedelta(hours=1))
    assert late.outcome.output == "no update 'rename' arrived before the timeout"
    assert late.state.records[0].status == FAILED


def test_wait_for_update_needs_a_name() -> None:
    outcome = turn(lambda ctx, inp: ctx.wait_for_update("")).outcome
    assert outcome.error is not None and "needs an update name" in outcome.error["message"]


# -- replying -----------------------------------------------------------------------------


def test_reply_records_the_answer_at_its_own_position() -> None:
    t = turn(_answer, signals=[_update(3, "rename", "ann")])
    assert t.outcome.output == "ann"
    reply = t.state.records[1]
    assert (reply.kind, reply.name, reply.status) == ("reply", "rename", COMPLETED)
    assert (reply.input, reply.output) == ({"update": 3}, {"renamed": "ann"})


def test_a_replayed_reply_records_nothing_new() -> None:
    recorded = [_received(0, 3, "rename", "ann"), done(1, "rename", {"renamed": "ann"}, kind="reply")]
    recorded[1].input = {"update": 3}
    t = turn(_answer, recorded)
    assert t.outcome.output == "ann"
    assert t.state.unsaved() == []


def test_reply_to_an_update_this_run_did_not_receive_fails_the_run() -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        ctx.reply(durable.Update(99, "rename", "forged"), "no")

    outcome = turn(body).outcome
    assert outcome.status == "failed"
    assert "has not received" in outcome.error["message"]


def test_reply_needs_the_update_object() -> None:
    outcome = turn(lambda ctx, inp: ctx.reply(3, "no")).outcome
    assert outcome.error is not None and "answers the durable.Update" in outcome.error["message"]


def test_an_update_is_answered_once() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        update = ctx.wait_for_update("rename")
        ctx.reply(update, 1)
        try:
            ctx.reply(update, 2)
        except durable.InvalidInput as exc:
            return str(exc)

    t = turn(body, signals=[_update(3, "rename", "ann")])
    assert t.outcome.output == "update 3 ('rename') was already answered by ctx.reply()"
    assert [r.kind for r in t.state.records.values()] == ["update", "reply"]


@pytest.mark.parametrize(("value", "says"), [(object(), "JSON"), ("x" * 2000, "MAX_PAYLOAD_BYTES")])
def test_a_reply_must_be_json_within_the_payload_limit(value: Any, says: str) -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        ctx.reply(ctx.wait_for_update("rename"), value)

    state = turn(body, signals=[_update(3, "rename", "ann")], limits=replace(LIMITS, max_payload_bytes=1000))
    outcome, records = state.outcome, state.state.records
    assert outcome.status == "failed" and says in outcome.error["message"]
    assert [r.kind for r in records.values()] == ["update"]


# -- waiting for any of several signals ---------------------------------------------------


def test_wait_for_any_signal_takes_the_oldest_among_its_names() -> None:
    signals = [
        BufferedSignal(1, "other", 0),
        BufferedSignal(2, "reject", "no"),
        BufferedSignal(3, "approve", "yes"),
    ]
    t = turn(lambda ctx, inp: list(ctx.wait_for_any_signal(["approve", "reject"])), signals=signals)
    assert t.outcome.output == ["reject", "no"]
    assert [s.id for s in t.state.consumed] == [2]
    rec = t.state.records[0]
    assert (rec.kind, rec.name, rec.input["names"]) == ("any_signal", "approve|reject", ["approve", "reject"])


def test_wait_for_any_signal_returns_a_tuple_on_the_first_turn_and_on_replays() -> None:
    seen: list[Any] = []

    def body(ctx: durable.Context, inp: Any) -> None:
        seen.append(ctx.wait_for_any_signal(("approve", "reject")))

    t = turn(body, signals=[BufferedSignal(3, "approve", {"by": "ann"})])
    turn(body, t.state.records)
    assert seen == [("approve", {"by": "ann"})] * 2


def test_wait_for_any_signal_times_out_like_a_signal_wait() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        try:
            return ctx.wait_for_any_signal(["approve", "reject"], timeout="1d")
        except WaitTimeout as exc:
            return str(exc)

    first = turn(body)
    assert first.outcome.wake_at == T0 + LIMITS.reconcile_interval
    late = turn(body, first.state.records, now=T0 + timedelta(days=1))
    assert late.outcome.output == "none of the signals ['approve', 'reject'] arrived before the timeout"


def test_wait_for_any_signal_over_other_names_is_a_change_of_code() -> None:
    recorded = done(0, "approve|reject", ["approve", 1], kind="any_signal")
    outcome = turn(lambda ctx, inp: ctx.wait_for_any_signal(["approve", "cancel"]), [recorded]).outcome
    assert outcome.error is not None and outcome.error["code"] == "non_determinism"


@pytest.mark.parametrize(
    ("names", "says"),
    [
        ("approve", "non-empty list of signal names"),
        ([], "non-empty list of signal names"),
        (["approve", ""], "non-empty signal names"),
        (["x" * 200, "y" * 200], "at most 255 fit"),
    ],
)
def test_wait_for_any_signal_refuses_bad_names(names: Any, says: str) -> None:
    outcome = turn(lambda ctx, inp: ctx.wait_for_any_signal(names)).outcome
    assert outcome.error is not None and says in outcome.error["message"]
    assert outcome.error["type"] == "InvalidInput"


# -- exposing values ----------------------------------------------------------------------


def test_expose_records_a_position_and_sets_the_value_the_last_write_wins() -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        ctx.expose("phase", "packing")
        ctx.expose("phase", "shipping")
        ctx.expose("parcel", {"id": 7})

    t = turn(body, exposed={"older": 1})
    assert [(r.kind, r.name, r.output) for r in t.state.records.values()] == [
        ("expose", "phase", "packing"),
        ("expose", "phase", "shipping"),
        ("expose", "parcel", {"id": 7}),
    ]
    assert t.state.exposed == {"older": 1, "phase": "shipping", "parcel": {"id": 7}}
    assert t.state.exposed_changed


def test_a_replayed_expose_neither_writes_nor_undoes_a_later_value() -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        ctx.expose("phase", "packing")
        ctx.wait_for_signal("go")

    # A later turn of the run exposed "shipping" since; replaying "packing" must not bring it back.
    t = turn(body, [done(0, "phase", "packing", kind="expose")], exposed={"phase": "shipping"})
    assert t.state.exposed == {"phase": "shipping"}
    assert not t.state.exposed_changed


def test_expose_returns_nothing_and_stores_the_tagged_json_value() -> None:
    t = turn(lambda ctx, inp: ctx.expose("when", (1, 2)))
    assert t.outcome.output is None
    assert t.state.exposed == {"when": {"__durable__": "tuple", "v": [1, 2]}}


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [("", 1, "needs a name"), ("x" * 256, 1, "needs a name"), ("ok", object(), "JSON")],
)
def test_expose_refuses_bad_names_and_values(name: str, value: Any, says: str) -> None:
    outcome = turn(lambda ctx, inp: ctx.expose(name, value)).outcome
    assert outcome.error is not None and says in outcome.error["message"]
