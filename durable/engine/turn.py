"""Run one turn of a run under its lease: load the history, replay the body, persist the outcome.

A turn's writes are fenced: each is conditional on this turn still holding the lease, and the
final settle also on the run's wake counter, so a wake that lands mid-turn makes the turn run
again instead of going to sleep on stale facts.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, connections, transaction

from .. import clock, conf, dispatch, errors, metrics, shutdown, tracing
from ..definitions import Workflow, registry
from ..errors import InvalidInput, WorkflowNotRegistered, _ControlFlow
from ..models import FIRST_CLAIM, Checkpoint, Run, Signal, Status
from ..models import result_and_turn as taken_rows
from ..models.result_and_turn import Held
from ..models.runs import settling
from ..replay.core import replay
from ..replay.history import Decision, Limits
from ..replay.turnstate import RunFacts, TurnState
from ..statuses import Decided, Turned
from . import (
    attempts,
    blocked,
    events,
    flow,
    histories,
    leases,
    lifecycle,
    namespaces,
    observe,
    remote_turns,
    runs,
    turn_writes,
    write_plan,
)
from .turn_writes import LeaseLost, _Stale
from .write_plan import FlushWrite, TurnWrite

T = TypeVar("T")

log = logging.getLogger("durable.engine")

#: A turn re-runs at most this many times in a row because wakes kept arriving.
MAX_RERUNS = 20
#: Pauses between the tries of a repair after the database went away mid-turn (seconds).
REPAIR_TRIES = (0.0, 0.5, 1.0, 2.0, 4.0)


class _DatabaseLost(_ControlFlow):
    """The database failed a query the body's primitives asked for: the turn ends as a crashed
    one (its lease lapses, or the repair sends it again), never as the body's own failure.

    Control flow, so the body cannot take it for an error of its own and fail the run with it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def limits(settings: conf.Settings) -> Limits:
    return Limits(
        reconcile_interval=settings.RECONCILE_INTERVAL,
        redispatch_after=settings.STEP_REDISPATCH_AFTER,
        timeout_grace=settings.STEP_TIMEOUT_GRACE,
        heartbeat_throttle=settings.HEARTBEAT_PERSIST_THROTTLE,
        default_queue=settings.DEFAULT_QUEUE,
        event_ttl=settings.EVENT_BUFFER_TTL,
        max_payload_bytes=settings.MAX_PAYLOAD_BYTES,
        remote_queues=frozenset(settings.REMOTE_QUEUES),
        redispatch_limit=settings.STEP_REDISPATCH_LIMIT,
        park_nondeterminism=settings.ON_NONDETERMINISM == "park",
        sealed_payloads=bool(settings.CODEC),
        lease=settings.LEASE,
    )


def advance(run_id: str) -> str:
    """Run turns of ``run_id`` until it settles; return what happened, for logs and tests."""
    settings = conf.get()
    return _repairing(run_id, settings, lambda: _advance(run_id, settings))


def advance_claimed(run: Run, owner: str, history: histories.Positions | None = None) -> str:
    """``advance`` a run whose lease ``owner`` took already (with the write that woke it);
    ``history``: its positions, when that write read them too."""
    settings = conf.get()
    return _repairing(run.id, settings, lambda: _claimed(run, owner, settings, first=False, history=history))


def _repairing(run_id: str, settings: conf.Settings, turns: Callable[[], str]) -> str:
    try:
        try:
            return turns()
        except _DatabaseLost as lost:
            raise lost.error from None
    except (OperationalError, InterfaceError):
        # The database went away mid-turn. This message, the run's prompt, is spent, and a
        # commit this process could not confirm may hold sends it never published.
        resend_when_the_database_answers(run_id, settings)
        raise


def resend_when_the_database_answers(run_id: str, settings: conf.Settings) -> None:
    """Once the database answers, send the run's unstarted attempts and its turn again."""
    resend_all_when_the_database_answers([run_id], settings)


def resend_all_when_the_database_answers(run_ids: list[str], settings: conf.Settings) -> None:
    """``resend_when_the_database_answers`` for each of ``run_ids``, one wait for all."""

    def resend() -> None:
        for run_id in run_ids:
            lifecycle.resend_unsent(run_id)

    _when_the_database_answers(resend, settings)


def new_owner(settings: conf.Settings) -> str:
    """A fresh lease owner: this worker, and this turn."""
    return f"{settings.INSTANCE_ID}/{uuid.uuid4().hex[:12]}"


def _advance(run_id: str, settings: conf.Settings) -> str:
    runs = Run.objects.using(settings.DATABASE)
    run = runs.claim(run_id, new_owner(settings), clock.now(), settings.LEASE, settings.NAMESPACE)
    if run is None:
        return Turned.FOREIGN if namespaces.refused(run_id, "a turn", settings) else Turned.BUSY
    owner = run.locked_by or ""
    return _claimed(run, owner, settings, first=owner.endswith(FIRST_CLAIM))


def _claimed(
    run: Run, owner: str, settings: conf.Settings, *, first: bool, history: histories.Positions | None = None
) -> str:
    run_id = run.id
    if remote_turns.is_remote(run, settings):
        if run.recovery_attempts > settings.MAX_RECOVERY_ATTEMPTS:
            die(run, settings)
            return Status.DEAD
        # Not held here: the remote worker's turn heartbeats keep the lease, or it lapses.
        return remote_turns.send(run, owner, settings, limits(settings), first=first)
    leases.hold(run_id, owner)
    attributes = {"durable.run_id": run_id, "durable.workflow": run.workflow, "durable.version": run.version}
    began, outcome = time.perf_counter(), "error"
    try:
        with tracing.span(f"durable.turn {run.workflow}", run_id, attributes) as span:
            outcome = _turns(run, owner, settings, first=first, history=history)
            if span is not None:
                span.set_attribute("durable.outcome", str(outcome))
            return outcome
    except BaseException as exc:
        if shutdown.is_leaving(exc):
            leases.leave(run_id)
        raise
    finally:
        leases.release(run_id)
        metrics.turn_ended(run.workflow, run.namespace, str(outcome), time.perf_counter() - began)


def _when_the_database_answers(write: Callable[[], None], settings: conf.Settings) -> None:
    for pause in REPAIR_TRIES:
        time.sleep(pause)
        connections[settings.DATABASE].close()
        try:
            write()
            return
        except (OperationalError, InterfaceError):
            continue
    log.warning("durable: the database did not answer; the sweeps will repair what this turn left")


def _turns(
    claimed: Run, owner: str, settings: conf.Settings, *, first: bool, history: histories.Positions | None
) -> str:
    """Run turns until one settles; ``first``: the claim that began them was the run's first."""
    runs = Run.objects.using(settings.DATABASE)
    run_id = claimed.id
    run: Run | None = claimed
    for _ in range(MAX_RERUNS):
        if run is None:
            return Turned.LOST
        if run.recovery_attempts > settings.MAX_RECOVERY_ATTEMPTS:
            die(run, settings)
            return Status.DEAD
        try:
            outcome = _turn(run, owner, settings, first, history)
        except LeaseLost:
            return Turned.LOST
        except leases.Interrupted:
            # Stopped: its lease is gone (nothing to write), or it ran past TURN_TIME_LIMIT.
            return give_back(run, owner, settings)
        except _Stale:
            # A wake landed during the turn: read the run again and replay.
            run = runs.filter(id=run_id, locked_by=owner).first()
            first, history = False, None
            continue
        if outcome is not None:
            return Turned.BLOCKED if outcome.blocked else outcome.status
        return Turned.PARKED
    runs.release(run_id, owner, clock.now(), clock.now())
    return Turned.BUSY


def die(run: Run, settings: conf.Settings) -> None:
    error = errors.recovery_exhausted(run.recovery_attempts - 1)
    with transaction.atomic(using=settings.DATABASE):
        if Run.objects.using(settings.DATABASE).end(run.id, Status.DEAD, error, clock.now()):
            lifecycle.finished(run.ended_as(Status.DEAD, error=error))


def give_back(run: Run, owner: str, settings: conf.Settings, state: TurnState | None = None) -> str:
    """Hand back a run whose turn ran past TURN_TIME_LIMIT, counted as a crashed turn; say what
    became of it (``lost`` if this turn no longer held it). ``state``: the abandoned turn's, whose
    results of steps run in place are written first, under its lease."""
    db = settings.DATABASE
    error = errors.turn_time_limit_exhausted(run.recovery_attempts + 1, settings.TURN_TIME_LIMIT)
    with transaction.atomic(using=db):
        if state is not None:
            turn_writes.keep_held_results(run.id, owner, state, db)
        became = Run.objects.using(db).give_back(
            run.id, owner, clock.now(), settings.MAX_RECOVERY_ATTEMPTS, error
        )
        if became == Status.DEAD:
            lifecycle.finished(run.ended_as(Status.DEAD, error=error))
        elif became == Status.SUSPENDED:
            dispatch.advance(run.id, run.queue or settings.DEFAULT_QUEUE)
    if became is None:
        return Turned.LOST
    log.warning(
        "durable: the turn of run %s ran past TURN_TIME_LIMIT (%s); the run is %s",
        run.id,
        settings.TURN_TIME_LIMIT,
        became,
        extra={"run_id": run.id, "workflow": run.workflow, "status": became},
    )
    return became


def _turn(
    run: Run,
    owner: str,
    settings: conf.Settings,
    first: bool = False,
    history: histories.Positions | None = None,
) -> Decision | None:
    db = settings.DATABASE
    try:
        workflow = registry.workflow(run.workflow, run.version)
    except WorkflowNotRegistered:
        # A rolling deploy: this worker lacks the code. Leave the run for one that has it.
        log.warning(
            "durable: %s@%s is not registered here; run %s left for another worker",
            run.workflow,
            run.version,
            run.id,
            extra={"run_id": run.id, "workflow": run.workflow, "version": run.version},
        )
        Run.objects.using(db).release(run.id, owner, clock.now(), clock.now() + settings.RECONCILE_INTERVAL)
        return None
    lost: list[BaseException] = []
    guarded = guarding(lost, _DatabaseLost)

    # A first claim: nothing stored yet. A claim that read the positions: those.
    records, read_at = ({}, None) if first else history or histories.read(run.id, db)
    state = TurnState(
        records=records,
        read_at=read_at,
        load_signals=guarded(lambda: histories.unconsumed_signals(run.id, db)),
        find_event=guarded(events.find),
        find_run=guarded(lambda run_id: histories.workflow_and_status(run_id, db)),
        exposed=dict(run.exposed or {}),
    )
    if first:
        observe.run_started(run)

    def renew() -> None:
        if leases.is_lost(run.id) or not Run.objects.using(db).renew(
            run.id, owner, clock.now(), settings.LEASE
        ):
            raise LeaseLost()

    def flush(current: TurnState) -> None:
        if leases.is_lost(run.id):
            raise LeaseLost()
        plan = write_plan.flush_plan(current)
        if plan.kind == FlushWrite.WITH_MESSAGES:
            # Messages and children go with their positions or not at all: the renewal locks the
            # run's row, so no other worker can take the lease over before this commits.
            with transaction.atomic(using=db):
                if not Run.objects.using(db).renew(run.id, owner, clock.now(), settings.LEASE):
                    raise LeaseLost()
                turn_writes.write(run.id, current, settings, fenced_by=owner, namespace=run.namespace)
                runs.start_children(run, current.children)
                current.children.clear()
                turn_writes.hand_off(current)  # gates after the run's row, as a recorded result locks them
        elif plan.kind == FlushWrite.RESULT_AND_START:
            assert plan.pair is not None
            turn_writes.write_result_and_start(
                run.id, owner, plan.pair, current, settings, namespace=run.namespace
            )
        elif plan.kind == FlushWrite.TRANSACTION:
            # Signals taken, replies, exposed values and entity ops sent go with their position,
            # or a crash between could lose them; so does a slot a result freed, handed on.
            with transaction.atomic(using=db):
                turn_writes.write(run.id, current, settings, fenced_by=owner, namespace=run.namespace)
                turn_writes.hand_off(current)
        else:
            turn_writes.write(run.id, current, settings, fenced_by=owner, namespace=run.namespace)
        turn_writes.mark_saved(current)

    try:
        body_input = workflow.body_input(run.input)
    except InvalidInput as exc:
        outcome = Decision(Decided.FAILED, error=exc.to_dict())
        with transaction.atomic(using=db):
            _settle(run, owner, outcome, settings)
        return outcome
    leases.watch(run.id, owner, settings.TURN_TIME_LIMIT, lambda: give_back(run, owner, settings, state))
    try:
        outcome = _replay(run, owner, workflow, body_input, state, settings, guarded(flush), guarded(renew))
    except leases.Interrupted:
        # Stopped (past TURN_TIME_LIMIT, say, in a body that never reached a primitive): a step
        # run in place before it completed, and stays so, rather than counting as lost.
        turn_writes.keep_held_results(run.id, owner, state, db)
        raise
    except BaseException as exc:
        if shutdown.is_leaving(exc):
            # So does one whose worker is shutting down: a deploy must not run it again.
            leases.while_leaving(
                "keep results of steps run in place", turn_writes.keep_held_results, run.id, owner, state, db
            )
        raise
    finally:
        leases.unwatch(run.id)
    if lost:
        raise lost[0]
    finish(run, owner, workflow, state, outcome, settings)
    return outcome


def finish(
    run: Run,
    owner: str,
    workflow: Workflow | None,
    state: TurnState,
    outcome: Decision,
    settings: conf.Settings,
) -> None:
    """Persist what a turn changed and its outcome, fenced by ``owner``'s lease and the run's wake
    counter as the turn read it (``run.wakes``); raise _Stale if a wake landed since.

    The same writes whether the body was replayed here or on a remote worker (``remote_turns``);
    ``workflow`` is needed only to continue as new (looked up when None)."""
    plan = write_plan.turn_plan(run, owner, state, outcome, settings.DATABASE)
    if plan.kind == TurnWrite.PARK:
        blocked.park(run, owner, outcome, state, settings)  # nothing of the turn is written
        return
    if plan.kind == TurnWrite.SETTLE:
        # One autocommitted UPDATE, not BEGIN, UPDATE, COMMIT.
        _settle(run, owner, outcome, settings, state)
    elif plan.kind in (TurnWrite.INSERT_AND_SETTLE, TurnWrite.RESULT_AND_SETTLE):
        written = state.unsaved()
        held = _settle(
            run, owner, outcome, settings, state, inserting=plan.inserting, rewriting=plan.rewriting
        )
        turn_writes.send(run.id, state, settings, written, namespace=run.namespace, held=held)
    else:
        try:
            with transaction.atomic(using=settings.DATABASE):
                turn_writes.write(run.id, state, settings, namespace=run.namespace)
                runs.start_children(run, state.children)
                state.children.clear()
                if outcome.status == Decided.CONTINUED:
                    successor = runs.continue_as_new(
                        run,
                        workflow or registry.workflow(run.workflow, run.version),
                        outcome.next_input,
                        exposed=state.exposed,
                    )
                    outcome.output = {"continued_as": successor}
                _settle(run, owner, outcome, settings, state)
                if outcome.status == Decided.CONTINUED:
                    Signal.objects.using(settings.DATABASE).carry_over(run.id, outcome.output["continued_as"])
                # After the settle: a gate is locked after the run's row, as a recorded result does.
                turn_writes.hand_off(state)
        except _Stale:
            turn_writes.keep_held_results(run.id, owner, state, settings.DATABASE)
            raise
    turn_writes.hand_off(state)  # a slot freed by the one statement above (the general write did its own)
    if outcome.status == Decided.SUSPENDED and events.arrived_since(state.records):
        lifecycle.wake(run.id)


def _replay(
    run: Run,
    owner: str,
    workflow: Workflow,
    body_input: Any,
    state: TurnState,
    settings: conf.Settings,
    flush: Callable[[TurnState], None],
    renew: Callable[[], None],
) -> Decision:
    return replay(
        workflow,
        facts(run, body_input),
        state,
        clock=clock.now,
        limits=limits(settings),
        flush=flush,
        renew=renew,
        in_place=attempts.InPlace.offered(run.id, owner, run.queue or settings.DEFAULT_QUEUE, settings),
        local_limits=attempts.Limited(run.id, owner, run.queue or settings.DEFAULT_QUEUE, settings),
        # Lease gone or time limit passed: in memory, so every primitive may ask.
        stopped=lambda: leases.stopping(run.id),
    )


def guarding(
    lost: list[BaseException], stop: Callable[[BaseException], BaseException]
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A wrapper for what the body's primitives ask of the database: a failure there is the
    turn's, not the body's. It raises ``stop(error)`` into the body and remembers it in ``lost``,
    so the turn sees it even when the body catches everything."""

    def guarded(query: Callable[..., T]) -> Callable[..., T]:
        def call(*args: Any) -> T:
            try:
                return query(*args)
            except (OperationalError, InterfaceError) as exc:
                lost.append(stop(exc))
                raise lost[-1] from exc

        return call

    return guarded


def facts(run: Run, body_input: Any) -> RunFacts:
    """What the replay core knows of ``run``."""
    return RunFacts(
        run.id, run.workflow, run.version, run.namespace or None, body_input, run.deadline, run.cancel_request
    )


def _settle(
    run: Run,
    owner: str,
    outcome: Decision,
    settings: conf.Settings,
    state: TurnState | None = None,
    inserting: Checkpoint | None = None,
    rewriting: tuple[str, list[Any]] | None = None,
) -> Held | None:
    """Write the turn's outcome and let its lease go; raise _Stale when refused. What the settle
    read back of an attempt it took for this process (``inserting``, held), if it read it."""
    fields = run_fields(outcome)
    if state is not None and state.search_attributes is not None:
        fields["search_attributes"] = state.search_attributes
    if state is not None and state.exposed_changed:
        fields["exposed"] = state.exposed
    held: Held | None = None
    if inserting is not None and inserting.held_by and attempts.reads_run_with_take(settings):
        settle = settling(run.id, owner, run.wakes, clock.now(), fields)
        held = taken_rows.settle_holding(settings.DATABASE, settle, inserting, histories.RECORD_FIELDS)
        if held is None:
            raise _Stale()
    elif not Run.objects.using(settings.DATABASE).settle(
        run.id, owner, run.wakes, clock.now(), inserting=inserting, rewriting=rewriting, **fields
    ):
        raise _Stale()
    if outcome.status in (Decided.COMPLETED, Decided.FAILED, Decided.CANCELLED):
        lifecycle.finished(
            run.ended_as(
                fields["status"],
                output=fields.get("output"),
                error=fields.get("error"),
                finished_at=fields["finished_at"],
            ),
            may_hold_slots=state is None or flow.may_hold_slots(state.records.values()),
            may_have_children=state is None or lifecycle.started_children(state),
        )
    elif outcome.status == Decided.CONTINUED:
        observe.run_ended(
            run.ended_as(Status.COMPLETED, output=outcome.output, finished_at=fields["finished_at"])
        )
    else:
        observe.run_suspended(run, outcome.wake_at)
        if state is not None and state.timers:
            # A timer due soon (a retry's backoff, a short sleep) fires on time without beat.
            dispatch.advance_at(run.id, run.queue or settings.DEFAULT_QUEUE, min(state.timers))
    return held


def run_fields(outcome: Decision) -> dict[str, Any]:
    """The run's columns a turn with ``outcome`` settles it with (besides the lease's)."""
    now = clock.now()
    # A turn that settles got past where a parked run's turns were blocked: its error goes.
    if outcome.status in (Decided.COMPLETED, Decided.CONTINUED):
        return {
            "status": Status.COMPLETED,
            "output": outcome.output,
            "error": None,
            "finished_at": now,
            "wake_at": None,
        }
    if outcome.status == Decided.CANCELLED:
        return {"status": Status.CANCELLED, "error": outcome.error, "finished_at": now, "wake_at": None}
    if outcome.status == Decided.FAILED:
        return {
            "status": Status.FAILED,
            "error": outcome.error,
            "failed_seqs": outcome.failed_seqs,
            "finished_at": now,
            "wake_at": None,
        }
    return {"status": Status.SUSPENDED, "wake_at": outcome.wake_at, "error": None}
