"""A step's result and its run's next turn, written together (PostgreSQL).

The worker that ran a step would record the result, wake and claim the run, replay its body and
settle it with the next step's position: two statements, two commits. When the run waited for
this step alone, the take read the run (see ``models.ahead``); the body is then replayed ahead of
any write, and if the turn only starts the next step, the result, the settle and the new position
are one statement, fenced by the version of the run's row the take read. Anything else (a
wake, a claim or a turn in between, a turn that would run a local step, write anything more, or
end the run) leaves it to the usual path, which records the result as if this were never tried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, connections

from .. import clock, conf, dispatch
from ..definitions import registry
from ..errors import InvalidInput, WorkflowNotRegistered
from ..models import Checkpoint, Run, Status
from ..models import ahead as rows
from ..models.ahead import Ahead
from ..replay.context import replay
from ..replay.history import COMPLETED
from ..replay.stopping import NotAhead
from ..replay.turnstate import RunFacts, TurnState
from ..statuses import Decided
from . import attempts, events, handover, histories, lifecycle, observe, remote_turns, turn, writes

log = logging.getLogger("durable.engine")


def wanted(settings: conf.Settings) -> bool:
    """Whether this process reads the run with each take: a worker that runs a run's next turn
    itself, on PostgreSQL (the fence is the row's version there)."""
    served = dispatch.transport.served_queues  # None: every queue (the test harness)
    return (
        settings.INLINE_NEXT_TURN
        and served != set()
        and connections[settings.DATABASE].vendor == "postgresql"
    )


def take(
    run_id: str,
    seq: int,
    attempt: int,
    token: str | None,
    holder: str,
    now: datetime,
    until: datetime,
    settings: conf.Settings,
) -> tuple[Checkpoint | None, Ahead | None]:
    """``CheckpointQuerySet.take``; when ``wanted``, the run too, as it stands, if it waits for
    this position alone."""
    db = settings.DATABASE
    if not wanted(settings):
        return Checkpoint.objects.using(db).take(run_id, seq, attempt, token, holder, now, until), None
    return rows.take(db, run_id, seq, attempt, token, holder, now, until, histories.RECORD_FIELDS)


def record(
    row: Checkpoint,
    read: Ahead,
    output: Any,
    settings: conf.Settings,
    began: float | None,
    recorded_as: Callable[[], None],
) -> str | None:
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
    now = clock.now()
    positions = histories.records(read.positions)
    done = positions[row.seq]
    done.status, done.output, done.error, done.wake_at, done.finished_at = COMPLETED, output, None, None, now
    done.stored_as = (COMPLETED, done.attempt)
    state = TurnState(
        records=positions,
        load_signals=lambda: histories.unconsumed_signals(run.id, settings.DATABASE),
        exposed=dict(run.exposed or {}),
        logs=[],
    )
    queue = run.queue or settings.DEFAULT_QUEUE
    try:
        outcome = replay(
            workflow,
            RunFacts(
                run.id,
                run.workflow,
                run.version,
                run.namespace or None,
                body_input,
                run.deadline,
                run.cancel_request,
            ),
            state,
            clock=clock.now,
            limits=turn.limits(settings),
            flush=_refused,
            renew=lambda: None,
            # A next step this worker would run in place goes the usual way (its start is a
            # write of the turn): run here, it crosses no broker at all.
            in_place=attempts.InPlace.offered(run.id, "", queue, settings),
            ahead=True,
        )
    except NotAhead:
        return None
    new = writes.lone_insert(run.id, state) if outcome.status == Decided.SUSPENDED else None
    if new is None or state.exposed_changed or state.search_attributes is not None:
        return None
    written = state.unsaved()
    try:
        recorded, settled = rows.complete_and_settle(
            settings.DATABASE,
            run.id,
            row.seq,
            row.attempt,
            output,
            now,
            read.version,
            {"status": Status.SUSPENDED, "wake_at": outcome.wake_at},
            new,
        )
    except (OperationalError, InterfaceError):
        # A commit this process could not confirm may hold the next step, never sent. The try
        # again (the caller's) then finds the attempt settled: "stale", its sends repaired here.
        turn.resend_when_the_database_answers(run.id, settings)
        raise
    if not recorded:
        return "stale"
    recorded_as()
    if not settled:
        # The run moved since the take: wake it, as recording a result does, for a turn that
        # reads it as it now stands.
        now = clock.now()
        queue = Run.objects.using(settings.DATABASE).wake(run.id, now, now + settings.LEASE)
        if queue:
            handover.next_turn(run.id, queue, settings, began)
        return COMPLETED
    for line in state.logs or ():
        logging.getLogger(line.name).handle(line)
    observe.run_suspended(run, outcome.wake_at)
    writes.send(run.id, state, settings, written, namespace=run.namespace)
    if events.arrived_since(state.records):
        lifecycle.wake(run.id)
    return COMPLETED


def _refused(state: TurnState) -> None:
    raise NotAhead("the turn would write before it ends")
