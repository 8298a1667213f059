"""A step's result and its run's next turn, written together (PostgreSQL).

The worker that ran a step would record the result, wake and claim the run, replay its body and
settle it with the next step's position: two statements, two commits. When the run waited for
this step alone, the take read the run (see ``models.result_and_turn``); the body is then
replayed ahead of any write, and if the turn only starts the next step (its plan,
``write_plan.turn_plan``, inserts one position with the settle), the result, the settle and the
new position are one statement, fenced by the version of the run's row the take read; if it only
completes a run that tells no parent and no singleton line, the result and the settle are.
Anything else (a wake, a claim or a turn in between, a turn that would run a local step, write
anything more, or end the run otherwise) leaves it to the usual path, which records the result
as if this were never tried. A run's first turn is replayed ahead the same way (``replay_ahead``,
``first_turns``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError

from .. import clock, conf, metrics, tracing
from ..definitions import Workflow, registry
from ..errors import InvalidInput, WorkflowNotRegistered
from ..models import Checkpoint, Run, Status
from ..models import result_and_turn as rows
from ..models.result_and_turn import RunAsTaken
from ..replay.core import replay
from ..replay.history import COMPLETED, Decision, Record
from ..replay.stopping import NotAhead
from ..replay.turnstate import TurnState
from ..statuses import UNFINISHED, Attempted, CheckpointStatus, Decided
from . import (
    attempts,
    events,
    flow,
    histories,
    lifecycle,
    next_turn,
    observe,
    remote_turns,
    turn,
    turn_writes,
    write_plan,
)
from .write_plan import TurnPlan, TurnWrite


def take(
    run_id: str,
    seq: int,
    attempt: int,
    token: str | None,
    holder: str,
    now: datetime,
    until: datetime,
    settings: conf.Settings,
) -> tuple[Checkpoint | None, RunAsTaken | None]:
    """``CheckpointQuerySet.take`` (of a run of this worker's namespace only); when this process
    reads the run with each take (``attempts.reads_run_with_take``), the run too, as it stands,
    if it waits for this position alone."""
    db, namespace = settings.DATABASE, settings.NAMESPACE
    if not attempts.reads_run_with_take(settings):
        return Checkpoint.objects.using(db).take(
            run_id, seq, attempt, token, holder, now, until, namespace
        ), None
    return rows.take(db, run_id, seq, attempt, token, holder, now, until, histories.RECORD_FIELDS, namespace)


def held(
    run_id: str, seq: int, attempt: int, holder: str, settings: conf.Settings
) -> tuple[Checkpoint | None, RunAsTaken | None]:
    """The attempt a turn took for ``holder`` (still pending, held so) and, as ``take`` reads
    it, its run."""
    db = settings.DATABASE
    if not attempts.reads_run_with_take(settings):
        pending = Checkpoint.objects.using(db).filter(
            run_id=run_id, seq=seq, attempt=attempt, status=CheckpointStatus.PENDING, held_by=holder
        )
        return pending.filter(run__status__in=UNFINISHED).first(), None
    return rows.held(db, run_id, seq, attempt, holder, histories.RECORD_FIELDS)


def record(
    row: Checkpoint,
    read: RunAsTaken,
    output: Any,
    settings: conf.Settings,
    began: float | None,
    recorded_as: Callable[[], None],
) -> Attempted | None:
    """Record ``output`` as the attempt's result with the run's next turn, if that turn only
    starts the next step: "completed" (``recorded_as`` called once it is), or "stale" if the
    attempt was settled meanwhile; None when the usual path must record it (nothing written)."""
    run = read.run
    if not attempts.serves(run.queue) or remote_turns.is_remote(run, settings):
        return None
    try:
        workflow = registry.workflow(run.workflow, run.version)
        body_input = workflow.body_input(run.input)
    except (WorkflowNotRegistered, InvalidInput):
        return None
    attributes = {"durable.run_id": run.id, "durable.workflow": run.workflow, "durable.version": run.version}
    started = time.perf_counter()
    with tracing.span(f"durable.turn {run.workflow}", run.id, attributes) as span:
        now = clock.now()
        replayed = _replayed(workflow, body_input, row, read, output, now, settings)
        written = (
            _write(row, read, output, now, settings, began, recorded_as, *replayed) if replayed else None
        )
        outcome = replayed[0].status if replayed and written == Attempted.COMPLETED else "not ahead"
        if span is not None:
            span.set_attribute("durable.outcome", outcome)
    if outcome != "not ahead":  # else the usual turn runs, and is measured, after this
        metrics.turn_ended(run.workflow, run.namespace, str(outcome), time.perf_counter() - started)
    return written


def _replayed(
    workflow: Workflow,
    body_input: Any,
    row: Checkpoint,
    read: RunAsTaken,
    output: Any,
    now: datetime,
    settings: conf.Settings,
) -> tuple[Decision, TurnState, TurnPlan] | None:
    """The run's next turn, with this result, replayed before anything is written: its outcome
    and what it would write; None if it would do anything a turn holding the run must do."""
    run, db = read.run, settings.DATABASE
    positions = histories.records(read.positions)
    done = positions[row.seq]
    done.status, done.output, done.error, done.wake_at, done.finished_at = COMPLETED, output, None, None, now
    done.stored_as = (COMPLETED, done.attempt)
    try:
        # The take read the positions no later than it started the attempt.
        outcome, state, lost = replay_ahead(workflow, body_input, run, positions, row.started_at, settings)
    except NotAhead:
        return None
    plan = write_plan.turn_plan(run, "", state, outcome, db)
    # The turn's write fits the result's statement when it inserts the next position, or only
    # ends a run (the statement writes no exposed values or search attributes).
    fits = plan.kind == TurnWrite.INSERT_AND_SETTLE or (
        plan.kind == TurnWrite.SETTLE and outcome.status == Decided.COMPLETED
    )
    if lost or not fits or state.exposed_changed or state.search_attributes is not None:
        return None
    return outcome, state, plan


def _write(
    row: Checkpoint,
    read: RunAsTaken,
    output: Any,
    now: datetime,
    settings: conf.Settings,
    began: float | None,
    recorded_as: Callable[[], None],
    outcome: Decision,
    state: TurnState,
    plan: TurnPlan,
) -> Attempted | None:
    run = read.run
    ends = outcome.status == Decided.COMPLETED
    new = plan.inserting
    run_fields = turn.run_fields(outcome)
    written = state.unsaved()
    try:
        recorded, settled = Checkpoint.objects.using(settings.DATABASE).complete_and_settle(
            run.id,
            row.seq,
            row.attempt,
            output,
            now,
            read.version,
            run_fields,
            new,
        )
    except (OperationalError, InterfaceError):
        # A commit this process could not confirm may hold the next step, never sent. The try
        # again (the caller's) then finds the attempt settled: "stale", its sends repaired here.
        turn.resend_when_the_database_answers(run.id, settings)
        raise
    if not recorded:
        return Attempted.STALE
    recorded_as()
    if not settled:
        # The run moved since the take: wake it, as recording a result does, for a turn that
        # reads it as it now stands.
        at = clock.now()
        queue = Run.objects.using(settings.DATABASE).wake(run.id, at, at + settings.LEASE)
        if queue:
            next_turn.run_or_send(run.id, queue, settings, began)
        return Attempted.COMPLETED
    for line in state.logs or ():
        logging.getLogger(line.name).handle(line)
    if ends:
        ended = run.ended_as(Status.COMPLETED, output=outcome.output, finished_at=run_fields["finished_at"])
        lifecycle.finished(
            ended,
            may_hold_slots=flow.may_hold_slots(state.records.values()),
            may_have_children=lifecycle.started_children(state),
        )
    else:
        observe.run_suspended(run, outcome.wake_at)
    turn_writes.send(run.id, state, settings, written, namespace=run.namespace)
    turn_writes.hand_off(state)  # a slot the replay freed (none, as a rule: that turn writes more)
    if not ends and events.arrived_since(state.records):
        lifecycle.wake(run.id)
    return Attempted.COMPLETED


class QueryFailed(NotAhead):
    """A query the body asked for failed: the replay saw less than a turn would."""


def replay_ahead(
    workflow: Workflow,
    body_input: Any,
    run: Run,
    records: dict[int, Record],
    read_at: datetime | None,
    settings: conf.Settings,
    stopped: Callable[[], BaseException | None] | None = None,
) -> tuple[Decision, TurnState, bool]:
    """Replay ``run``'s body over ``records`` (read at ``read_at``): its outcome, the turn's
    state, and whether a query of the body failed (the replay then saw less than a turn would).
    Raises ``NotAhead`` where only a turn holding the run may go on."""
    db = settings.DATABASE
    lost: list[BaseException] = []
    # As in a turn: a failed query is never the body's to catch.
    guarded = turn.guarding(lost, lambda _: QueryFailed("the database failed a query of the body"))
    state = TurnState(
        records=records,
        load_signals=guarded(lambda: histories.unconsumed_signals(run.id, db)),
        find_event=guarded(events.find),
        find_run=guarded(lambda run_id: histories.workflow_and_status(run_id, db)),
        exposed=dict(run.exposed or {}),
        logs=[],
        read_at=read_at,
    )
    outcome = replay(
        workflow,
        turn.facts(run, body_input),
        state,
        clock=clock.now,
        limits=turn.limits(settings),
        flush=_refused,
        renew=lambda: None,
        # A step this worker would run in place goes the usual way (its start is a write of the
        # turn); an ``async def`` step it would await on its loop is held in the turn's write.
        in_place=attempts.InPlace.offered(run.id, "", run.queue or settings.DEFAULT_QUEUE, settings),
        stopped=stopped,
        ahead=True,
    )
    return outcome, state, bool(lost)


def _refused(state: TurnState) -> None:
    raise NotAhead("the turn would write before it ends")
