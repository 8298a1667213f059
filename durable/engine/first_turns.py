"""First turns written ahead of any claim (PostgreSQL).

A run's first turn takes its lease (a claim, one commit), replays the body and settles it with
what the body asked for (a second commit). When that turn only starts one step (an ``async
def`` step this process then awaits, a step sent to its queue, a timer), nothing in it needs the
lease: the run is read with the version of its row, the body is replayed before anything is
written, and the settle and the new position are one statement, written only if the row is
still that version. A ``durable.advance_batch`` of runs just started (a loop of starts, a view
that starts many) so costs one read and one commit for all: their turns are replayed one after
the other, then written together in one pipeline, each statement fenced by its own version.

Anything else goes the usual way, as if this were never tried: a row written since the read, a
body that would run a step in this process or a local step, a turn that would write more than
one position, end the run or change its exposed values. A workflow whose first turn did not fit
once is not tried again by this process (its replay would be thrown away each time).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError

from .. import clock, conf, dispatch, metrics, shutdown, tracing
from ..definitions import Workflow, registry
from ..errors import InvalidInput, WorkflowNotRegistered
from ..models import Run, Status
from ..models import result_and_turn as rows
from ..replay.history import Decision
from ..replay.stopping import NotAhead
from ..replay.turnstate import TurnState
from ..statuses import Decided, Turned
from . import (
    attempts,
    events,
    histories,
    leases,
    lifecycle,
    observe,
    remote_turns,
    turn,
    turn_writes,
    write_plan,
)
from .result_and_turn import QueryFailed, replay_ahead
from .write_plan import TurnPlan, TurnWrite

log = logging.getLogger("durable.engine")

#: Workflows (name, version) whose first turn did not fit one statement in this process.
unfit: set[tuple[str, str]] = set()


def ahead(run_ids: list[str], settings: conf.Settings) -> dict[str, str]:
    """Write the first turns of those of ``run_ids`` that no turn has taken yet, where each fits
    one statement; return what became of each turn run here (run id to outcome). The others are
    left, untouched, to ``turn.advance``.

    Every turn is replayed first, then all are written together (``rows.settle_firsts``: one
    round trip and one commit for the lot), then each one's messages sent."""
    if not attempts.reads_run_with_take(settings):
        return {}
    try:
        fresh = rows.fresh(settings.DATABASE, run_ids, settings.NAMESPACE)
    except (OperationalError, InterfaceError):
        return {}  # the usual turns wait for the database, as they know how
    written: dict[str, str] = {}
    replayed: list[_Replayed] = []
    try:
        for run, version in fresh:
            if _tried(run, settings) and not _replay_into(run, version, settings, written, replayed):
                break
    except BaseException as exc:
        if shutdown.is_leaving(exc):
            # Those replayed before are not written: their turns go again, now.
            _resend_while_leaving([each.run.id for each in replayed])
        raise
    if replayed:
        written.update(_write(replayed, settings))
    return written


def _tried(run: Run, settings: conf.Settings) -> bool:
    return not (
        (run.workflow, run.version) in unfit
        or run.recovery_attempts > settings.MAX_RECOVERY_ATTEMPTS  # the usual turn ends it
        or not attempts.serves(run.queue or settings.DEFAULT_QUEUE)
        or remote_turns.is_remote(run, settings)
    )


def _replay_into(
    run: Run, version: str, settings: conf.Settings, written: dict[str, str], replayed: list[_Replayed]
) -> bool:
    """Replay the run's first turn, into ``replayed`` to be written (or its outcome into
    ``written`` when it was handed back); False when the runs after it must go the usual way."""
    began = time.perf_counter()
    try:
        ready = _replay(run, version, settings)
    except (OperationalError, InterfaceError):
        # Only a turn stopped at its limit writes here (its claim, which may hold a step it never
        # sent); the rest go the usual way, which waits for the database as a turn does.
        log.warning("durable: the first turn of run %s, replayed ahead, failed", run.id, exc_info=True)
        turn.resend_when_the_database_answers(run.id, settings)
        return False
    except Exception as exc:
        if shutdown.is_leaving(exc):
            raise
        unfit.add((run.workflow, run.version))
        log.error("durable: the first turn of run %s, written ahead, raised", run.id, exc_info=True)
        return True
    if isinstance(ready, str):  # stopped at its limit and handed back
        written[run.id] = ready
        metrics.turn_ended(run.workflow, run.namespace, ready, time.perf_counter() - began)
    elif ready is not None:
        replayed.append(ready)
    return True


@dataclass
class _Replayed:
    """A first turn replayed ahead, to be written: its run, the version read, what it decided."""

    run: Run
    version: str
    now: datetime
    outcome: Decision
    state: TurnState
    plan: TurnPlan
    began: float
    began_ns: int


def _replay(run: Run, version: str, settings: conf.Settings) -> _Replayed | str | None:
    """The run's first turn replayed ahead, watched by the lease keeper as a turn's replay is: a
    body that runs past TURN_TIME_LIMIT without reaching a primitive is stopped, and its run
    counted as a crashed turn's; one that ignores the stop is abandoned (``leases``). An outcome
    when it was handed back so; None when the usual turn must run it (nothing written)."""
    try:
        workflow = registry.workflow(run.workflow, run.version)
        body_input = workflow.body_input(run.input)
    except (WorkflowNotRegistered, InvalidInput):
        return None  # the usual turn parks or fails it, and says why
    began, began_ns, now = time.perf_counter(), time.time_ns(), clock.now()
    handed: list[str] = []
    leases.watch(
        run.id, leases.AHEAD, settings.TURN_TIME_LIMIT, lambda: handed.append(_give_back(run, settings))
    )
    try:
        replayed = _replayed(workflow, body_input, run, settings)
    except leases.Interrupted:
        if leases.is_lost(run.id):
            return None  # taken or ended meanwhile (a cancel, say): the usual turn finds out which
        unfit.add((run.workflow, run.version))
        return handed[0] if handed else _give_back(run, settings)
    except BaseException as exc:
        if shutdown.is_leaving(exc):
            # The worker is leaving around the body: nothing is written; its turn goes again.
            leases.while_leaving(f"send the turn of run {run.id} again", lifecycle.resend_unsent, run.id)
        raise
    finally:
        leases.unwatch(run.id)
        leases.lost.discard(run.id)
    if handed:
        return handed[0]  # abandoned, then ended after all: handed back, nothing written
    if replayed is None:
        return None
    return _Replayed(run, version, now, *replayed, began=began, began_ns=began_ns)


def _give_back(run: Run, settings: conf.Settings) -> str:
    """Count a first turn stopped at TURN_TIME_LIMIT as a crashed turn, as ``turn.give_back``
    counts one holding the run, under a claim taken for it."""
    claimed = Run.objects.using(settings.DATABASE).claim(
        run.id, turn.new_owner(settings), clock.now(), settings.LEASE, settings.NAMESPACE
    )
    if claimed is None:
        return Turned.BUSY
    return turn.give_back(claimed, claimed.locked_by or "", settings)


def _replayed(
    workflow: Workflow, body_input: Any, run: Run, settings: conf.Settings
) -> tuple[Decision, TurnState, TurnPlan] | None:
    """The run's first turn, replayed before anything is written: its outcome and what it would
    write; None if it would do anything only a turn holding the run may do."""
    db = settings.DATABASE
    try:
        outcome, state, lost = replay_ahead(
            workflow, body_input, run, {}, None, settings, stopped=lambda: leases.stopping(run.id)
        )
    except QueryFailed:
        return None
    except NotAhead:
        unfit.add((run.workflow, run.version))
        return None
    if lost or outcome.status == Decided.CANCELLED:
        return None  # cancelled before it began: the usual turn ends it
    if outcome.status != Decided.SUSPENDED:
        unfit.add((run.workflow, run.version))  # it ends in its first turn: written the usual way
        return None
    plan = write_plan.turn_plan(run, "", state, outcome, db)
    if (
        plan.kind != TurnWrite.INSERT_AND_SETTLE
        or state.exposed_changed
        or state.search_attributes is not None
    ):
        unfit.add((run.workflow, run.version))
        return None
    return outcome, state, plan


def _write(replayed: list[_Replayed], settings: conf.Settings) -> dict[str, str]:
    """Write the first turns ``replayed`` together, then send what each written one started;
    those refused (a row written since the read) are left to the usual turn."""
    db = settings.DATABASE
    firsts = []
    for each in replayed:
        assert each.plan.inserting is not None  # an INSERT_AND_SETTLE plan inserts one position
        firsts.append(
            rows.First(
                each.run.id, each.version, each.now, turn.run_fields(each.outcome), each.plan.inserting
            )
        )
    try:
        results = rows.settle_firsts(db, firsts, histories.RECORD_FIELDS)
    except (OperationalError, InterfaceError):
        # None of them may have committed, or all: each run's unsent messages and its turn are
        # sent again once the database answers; the usual turns find them settled or not.
        log.warning("durable: %d first turns written ahead failed", len(replayed), exc_info=True)
        turn.resend_all_when_the_database_answers([each.run.id for each in replayed], settings)
        return {}
    except DatabaseError:
        if len(replayed) > 1:
            # One of them refused by the database broke the lot, which wrote nothing: each alone
            # then, so that one costs only its own run.
            return {
                run_id: outcome for each in replayed for run_id, outcome in _write([each], settings).items()
            }
        run = replayed[0].run
        unfit.add((run.workflow, run.version))
        log.error("durable: the first turn of run %s, written ahead, raised", run.id, exc_info=True)
        return {}
    except BaseException as exc:
        if shutdown.is_leaving(exc):
            # Committed or not: each run's turn goes again, and finds it written or not.
            _resend_while_leaving([each.run.id for each in replayed])
        raise
    written: dict[str, str] = {}
    for position, (each, (done, held)) in enumerate(zip(replayed, results, strict=True)):
        run = each.run
        attributes = {
            "durable.run_id": run.id,
            "durable.workflow": run.workflow,
            "durable.version": run.version,
        }
        # The span of the whole turn, from its replay: the messages sent in it carry its context.
        with tracing.span(f"durable.turn {run.workflow}", run.id, attributes, start_ns=each.began_ns) as span:
            if done:
                try:
                    _written(each, held, settings)
                except BaseException as exc:
                    if shutdown.is_leaving(exc):
                        # Written, and this one's sends and those after it perhaps not sent.
                        _resend_while_leaving([later.run.id for later in replayed[position:]])
                    raise
            if span is not None:
                span.set_attribute("durable.outcome", str(Status.SUSPENDED if done else "not ahead"))
        if done:
            written[run.id] = Status.SUSPENDED
            metrics.turn_ended(
                run.workflow, run.namespace, Status.SUSPENDED, time.perf_counter() - each.began
            )
    return written


def _resend_while_leaving(run_ids: list[str]) -> None:
    for run_id in run_ids:
        leases.while_leaving(f"send the turn of run {run_id} again", lifecycle.resend_unsent, run_id)


def _written(each: _Replayed, held: rows.Held | None, settings: conf.Settings) -> None:
    """What follows a first turn's commit: its run observed started and suspended, its logs
    let out, its messages sent."""
    run, state = each.run, each.state
    run.status, run.started_at = Status.RUNNING, each.now  # as a claim would leave it, for run_started
    observe.run_started(run)
    run.status = Status.SUSPENDED
    for line in state.logs or ():
        logging.getLogger(line.name).handle(line)
    observe.run_suspended(run, each.outcome.wake_at)
    if state.timers:
        # A timer due soon fires on time without beat, as after any turn.
        dispatch.advance_at(run.id, run.queue or settings.DEFAULT_QUEUE, min(state.timers))
    turn_writes.send(run.id, state, settings, state.unsaved(), namespace=run.namespace, held=held)
    turn_writes.hand_off(state)
    if events.arrived_since(state.records):
        lifecycle.wake(run.id)
