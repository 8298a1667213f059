"""What a step's result and what a turn commit, decided once each, as a typed plan.

A step's result is written one of three ways (``ResultWrite``), a turn's outcome one of five
(``TurnWrite``), what a turn changed before its end one of four (``FlushWrite``).
``steps.record``, ``turn.finish`` and the turn's flush carry the plans out; the write of a result
with its run's next turn (``result_and_turn``) asks ``turn_plan`` of the turn it replayed, so a
turn run by a worker holding the run and the same turn written ahead with a result never disagree
about what fits one statement. The window in which a step that returned can still run again is
the same for every plan: from its return until the plan's commit (docs/architecture.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ..models import Checkpoint, Run
from ..replay.history import Decision, Record
from ..replay.turnstate import TurnState
from ..statuses import Decided
from . import lifecycle, turn_writes


class ResultWrite(enum.StrEnum):
    """How a step attempt's result is committed."""

    #: With its run's next turn, replayed before anything is written, in one statement fenced by
    #: the run's row version the take read (PostgreSQL). Declined by that replay: ``WITH_WAKE``.
    WITH_NEXT_TURN = "with_next_turn"
    #: Completed, outside a fan and a limit, nothing else unsaved: the result and the run's wake
    #: (and claim), one statement on PostgreSQL.
    WITH_WAKE = "with_wake"
    #: A failure, a retry, a fan member, a limited step, progress left unsaved: a transaction.
    TRANSACTION = "transaction"


def result_plan(
    row: Checkpoint, error: dict[str, Any] | None, unsaved_progress: bool, *, ahead: bool
) -> ResultWrite:
    """How the result of ``row``'s attempt is written. ``ahead``: the take read the run and
    this process may run its next turn (a claim), so the turn may be written with it."""
    if error is not None or row.fan is not None or unsaved_progress or row.flow_key:
        return ResultWrite.TRANSACTION
    return ResultWrite.WITH_NEXT_TURN if ahead else ResultWrite.WITH_WAKE


class TurnWrite(enum.StrEnum):
    """How a turn's outcome is committed."""

    #: The body is blocked (a nondeterminism, a version not installed): nothing is written.
    PARK = "park"
    #: The settle is all there is: one autocommitted UPDATE.
    SETTLE = "settle"
    #: One new position (the next step's, say) and the settle: one statement on PostgreSQL.
    INSERT_AND_SETTLE = "insert_and_settle"
    #: The held result of a step run in place and the settle: one statement on PostgreSQL. A
    #: refused settle leaves the result written, as a refused transaction keeps held results.
    RESULT_AND_SETTLE = "result_and_settle"
    #: Anything else (several positions, children, messages, signals taken, continue-as-new,
    #: telling a parent or a line): one transaction, fenced by the lease and the settle.
    TRANSACTION = "transaction"


@dataclass(frozen=True)
class TurnPlan:
    kind: TurnWrite
    #: ``INSERT_AND_SETTLE``: the new position's row.
    inserting: Checkpoint | None = None
    #: ``RESULT_AND_SETTLE``: the held result's UPDATE (its SQL and parameters).
    rewriting: tuple[str, list[Any]] | None = None


def turn_plan(run: Run, owner: str, state: TurnState, outcome: Decision, db: str) -> TurnPlan:
    """How the turn of ``run`` that came to ``outcome`` commits what it changed (``state``)."""
    if outcome.blocked:
        return TurnPlan(TurnWrite.PARK)
    if _only_the_settle_left(run, state, outcome):
        return TurnPlan(TurnWrite.SETTLE)
    if outcome.status == Decided.SUSPENDED and (new := turn_writes.lone_insert(run.id, state)):
        return TurnPlan(TurnWrite.INSERT_AND_SETTLE, inserting=new)
    if _settle_tells_no_one(run, outcome, state) and (
        held := turn_writes.lone_held_result(run.id, owner, state, db)
    ):
        return TurnPlan(TurnWrite.RESULT_AND_SETTLE, rewriting=held)
    return TurnPlan(TurnWrite.TRANSACTION)


class FlushWrite(enum.StrEnum):
    """How a turn commits what it changed before its end (before a step runs in place, after a
    local step): under the lease, so a turn that lost it writes nothing."""

    #: Positions with the messages or children they send or start: a transaction that renews
    #: the lease first (locking the run's row, so no other worker can take it over meanwhile).
    WITH_MESSAGES = "with_messages"
    #: The held result of the step just run in place and the next position: one statement on
    #: PostgreSQL, which commits alone (a limited step keeps there the slot the result freed,
    #: when nobody waits for it); a transaction elsewhere, and wherever a limited step's slot is
    #: taken from its gate or a freed one handed on with them.
    RESULT_AND_START = "result_and_start"
    #: Writes that go together (signals taken, replies, exposed values, entity ops, several
    #: positions, slots handed on with them): one transaction.
    TRANSACTION = "transaction"
    #: One position (a local step's record, say): one fenced statement.
    ALONE = "alone"


@dataclass(frozen=True)
class FlushPlan:
    kind: FlushWrite
    #: ``RESULT_AND_START``: the held result and the new position.
    pair: tuple[Record, Record] | None = None


def flush_plan(state: TurnState) -> FlushPlan:
    """How a write of the turn's changes before its end commits them."""
    if state.outgoing or state.children:
        return FlushPlan(FlushWrite.WITH_MESSAGES)
    if pair := turn_writes.result_and_start(state):
        return FlushPlan(FlushWrite.RESULT_AND_START, pair=pair)
    if (
        state.consumed
        or state.exposed_changed
        or turn_writes.replies(state)
        or state.new_entity_ops()
        or state.new_stream_writes()
        or len(state.unsaved()) > 1
        or state.freed
    ):
        return FlushPlan(FlushWrite.TRANSACTION)
    return FlushPlan(FlushWrite.ALONE)


def _only_the_settle_left(run: Run, state: TurnState, outcome: Decision) -> bool:
    if (
        state.unsaved()
        or state.consumed
        or state.dispatch
        or state.children
        or state.outgoing
        or state.exposed_changed
    ):
        return False
    return _settle_tells_no_one(run, outcome, state)


def _settle_tells_no_one(run: Run, outcome: Decision, state: TurnState) -> bool:
    """Whether the settle needs no other write of the turn in its transaction: it tells no parent
    and no singleton line, and closes no children."""
    if outcome.status == Decided.SUSPENDED:
        return True
    return (
        outcome.status == Decided.COMPLETED
        and not run.parent_id
        and not run.singleton_key
        and not lifecycle.started_children(state)
    )
