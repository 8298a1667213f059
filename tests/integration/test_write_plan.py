"""The write plans' table: how a step's result, a turn's outcome and its writes before its end
are committed (the paths themselves, and their statements, are pinned by test_costs.py and
test_result_and_turn.py)."""

from __future__ import annotations

import pytest

from durable.engine.write_plan import FlushWrite, ResultWrite, TurnWrite, flush_plan, result_plan, turn_plan
from durable.models import Checkpoint, Run
from durable.replay.history import Decision, Record
from durable.replay.turnstate import TurnState
from durable.statuses import Decided


def _position(**fields):
    return Checkpoint(run_id="r", seq=1, kind="step", name="s", **fields)


@pytest.mark.parametrize(
    ("fields", "error", "unsaved", "ahead", "expected"),
    [
        ({}, None, False, True, ResultWrite.WITH_NEXT_TURN),
        ({}, None, False, False, ResultWrite.WITH_WAKE),
        ({}, {"message": "no"}, False, True, ResultWrite.TRANSACTION),
        ({"fan": 1}, None, False, True, ResultWrite.TRANSACTION),
        ({"flow_key": "c:s:k"}, None, False, True, ResultWrite.TRANSACTION),
        ({}, None, True, True, ResultWrite.TRANSACTION),
    ],
    ids=["ahead", "common", "failed", "fan member", "limited", "progress unsaved"],
)
def test_a_results_plan(fields, error, unsaved, ahead, expected):
    assert result_plan(_position(**fields), error, unsaved, ahead=ahead) == expected


def _state(*records: Record) -> TurnState:
    return TurnState(records={rec.seq: rec for rec in records})


def _kept(seq: int) -> Record:
    rec = Record(seq, "step", "s", status="completed")
    rec.stored_as = ("completed", 1)
    return rec


def test_a_turns_plan():
    run, child = Run(id="r"), Run(id="c", parent_id="p")
    suspended, completed = Decision(Decided.SUSPENDED), Decision(Decided.COMPLETED, output=1)
    blocked = Decision(Decided.FAILED, error={"message": "x"}, blocked=True)

    assert turn_plan(run, "me", _state(_kept(0)), blocked, "default").kind == TurnWrite.PARK
    assert turn_plan(run, "me", _state(_kept(0)), suspended, "default").kind == TurnWrite.SETTLE
    assert turn_plan(run, "me", _state(_kept(0)), completed, "default").kind == TurnWrite.SETTLE
    # A child tells its parent in the settle's transaction.
    assert turn_plan(child, "me", _state(_kept(0)), completed, "default").kind == TurnWrite.TRANSACTION

    one_new = turn_plan(run, "me", _state(_kept(0), Record(1, "step", "s")), suspended, "default")
    assert one_new.kind == TurnWrite.INSERT_AND_SETTLE
    assert one_new.inserting is not None and one_new.inserting.seq == 1

    two_new = _state(_kept(0), Record(1, "step", "s"), Record(2, "step", "s"))
    assert turn_plan(run, "me", two_new, suspended, "default").kind == TurnWrite.TRANSACTION

    # A new position that sends an op or writes a stream sends it in the turn's transaction.
    for kind in ("entity", "stream", "close_stream"):
        sends = _state(_kept(0), Record(1, kind, "n"))
        assert turn_plan(run, "me", sends, suspended, "default").kind == TurnWrite.TRANSACTION, kind


def _held(seq: int, **fields) -> Record:
    """The result of an attempt run in place, held back for the next write."""
    rec = Record(seq, "step", "s", status="completed", **fields)
    rec.stored_as, rec.dirty = ("pending", 1), True
    return rec


def test_a_flushs_plan():
    assert flush_plan(_state(Record(0, "local", "s"))).kind == FlushWrite.ALONE

    pair = flush_plan(_state(_held(0), Record(1, "step", "s")))
    assert pair.kind == FlushWrite.RESULT_AND_START
    assert pair.pair is not None and [rec.seq for rec in pair.pair] == [0, 1]

    # A slot the result freed is handed on in the pair's own transaction.
    freed = _state(_held(0), Record(1, "step", "s"))
    freed.freed.append("c:s:k")
    assert flush_plan(freed).kind == FlushWrite.RESULT_AND_START

    # Anything else beside the pair goes in a transaction with it.
    consumed = _state(_held(0), Record(1, "step", "s"))
    consumed.consumed.append(object())
    exposed = _state(_held(0), Record(1, "step", "s"))
    exposed.exposed_changed = True
    members = _state(_held(0, fan=0), Record(1, "step", "s", fan=0))
    three = _state(_held(0), Record(1, "step", "s"), Record(2, "step", "s"))
    three.freed.append("c:s:k")
    entity_op = _state(_held(0), Record(1, "entity", "n"))
    for name, state in [
        ("signal taken", consumed),
        ("exposed value", exposed),
        ("fan members", members),
        ("three positions", three),
        ("entity op", entity_op),
    ]:
        assert flush_plan(state).kind == FlushWrite.TRANSACTION, name

    messages = _state(_held(0), Record(1, "step", "s"))
    messages.outgoing.append(object())
    assert flush_plan(messages).kind == FlushWrite.WITH_MESSAGES
