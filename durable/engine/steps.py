"""Execute one dispatched step attempt on a worker and record its result exactly once.

A duplicate or stale delivery finds the attempt no longer pending and changes nothing. A result
that arrives as a message, for an attempt run elsewhere, is checked in ``reported`` and recorded
here, by ``record``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from django.db import DataError, InterfaceError, OperationalError, connections, transaction

from .. import asyncsteps, clock, conf, shutdown, tracing
from ..definitions import Step, registry
from ..errors import ErrorCode, WorkflowNotRegistered, step_timeout_error
from ..models import HELD, AttemptError, Checkpoint, Claim, Fan, Run
from ..models.result_and_turn import Held, RunAsTaken
from ..replay.attempt import LATER, split_traceback
from ..replay.history import COMPLETED, FAILED, PENDING
from ..replay.stepscope import StepInfo
from ..statuses import Attempted
from . import (
    asyncattempts,
    attempts,
    flow,
    histories,
    leases,
    lifecycle,
    namespaces,
    next_turn,
    observe,
    result_and_turn,
    turn,
    write_plan,
)
from .attempts import Beats
from .write_plan import ResultWrite

T = TypeVar("T")


class _Written(NamedTuple):
    """What writing an attempt's result did."""

    #: How the attempt was recorded (completed or failed), or None: it was settled already.
    recorded: str | None
    #: The woken run's queue, once a wake reached it.
    woken: str | None
    #: A fan member whose fan is not closed yet: the run is woken once it is.
    joins_later: bool
    #: The run, when the write also took its turn lease (a claim).
    claimed: Run | None
    #: Its positions, when the claim read them.
    history: histories.Positions | None
    #: The fan's members still open, when it keeps a count.
    left: int | None


log = logging.getLogger("durable.engine")

#: How often recording a result is tried before the attempt is left to lapse, and the pause
#: before each retry: a database restart or a cut connection heals within seconds.
RECORD_TRIES = (0.0, 0.5, 1.0, 2.0, 4.0)
_TRANSIENT = (OperationalError, InterfaceError)


def run_step(run_id: str, seq: int, attempt: int, token: str | None = None) -> Attempted:
    """Run attempt ``attempt`` of the step at position ``seq`` of ``run_id``, record the result.

    The attempt is held by this process (renewed by the lease keeper) from the moment it starts
    until its result is recorded, so a death anywhere in between is known within a LEASE."""
    if not token:
        log.warning(
            "durable: refused run_step for %s#%s attempt %s: it carries no token", run_id, seq, attempt
        )
        return Attempted.STALE
    settings = conf.get()
    began = time.monotonic()
    holder = leases.process_holder()
    key = (run_id, seq, attempt)
    # Through a cut connection too: this message is the attempt's only prompt until
    # STEP_REDISPATCH_AFTER. A start that committed unseen finds the attempt started (stale
    # here): its hold then lapses and the attempt counts as lost, within a LEASE.
    started = _persistently(lambda: _start(run_id, seq, attempt, token, holder, clock.now(), settings), key)
    row, held_back, read = started or (None, None, None)
    if row is None:
        namespaces.refused(run_id, f"step attempt {seq}#{attempt}", settings)
        return Attempted.STALE
    if isinstance(held_back, flow.Waits):
        if held_back.until is not None:
            flow.wake_for_token(run_id, held_back.until)
        return Attempted.WAITING  # or sent again when a slot is handed to it
    if isinstance(held_back, flow.Refused):
        return record(row, registry.step(row.name), None, held_back.error, False, None, began)
    return _run(row, token, holder, began, read, settings)


def run_held(
    run_id: str, seq: int, attempt: int, token: str, holder: str, held: Held | None = None
) -> Attempted:
    """Run an attempt its turn took for this process (``holder``) in the write that recorded it,
    without a message: an ``async def`` step, started on the loop beside the turn. ``held``: the
    attempt and its run as that write read them back; else they are read here.

    Not found pending and held so (settled, or its run ended, since that commit): nothing to do.
    Not started at all (this process died first, or the database failed the read): its hold
    lapses within a LEASE and the attempt counts as lost, as one a worker took would."""
    settings = conf.get()
    began = time.monotonic()
    key = (run_id, seq, attempt)
    try:
        found = held or _persistently(
            lambda: result_and_turn.held(run_id, seq, attempt, holder, settings), key
        )
        row, read = found or (None, None)
        if row is None:
            return Attempted.STALE
        # Its outcome, if known at once, sends the next turn: this runs after a turn's commit.
        return _run(row, token, holder, began, read, settings, inline=False)
    except Exception:  # noqa: BLE001 - after the turn's commit: the hold lapses, the attempt is run again
        log.exception("durable: could not start step attempt %s#%s %s here", *key)
        return Attempted.UNSTARTED


def _run(
    row: Checkpoint,
    token: str,
    holder: str,
    began: float,
    read: RunAsTaken | None,
    settings: conf.Settings,
    *,
    inline: bool = True,
) -> Attempted:
    """Run the attempt ``holder`` took (``row``) and record its result (the next turn here, when
    ``inline`` and it may)."""
    run_id, seq, attempt = key = (row.run_id, row.seq, row.attempt)
    leases.hold_attempt(key, holder)
    observe.step_started(row, row.started_at)
    attributes = {
        "durable.run_id": run_id,
        "durable.seq": seq,
        "durable.step": row.name,
        "durable.attempt": attempt,
    }
    detached = False
    try:
        with tracing.span(f"durable.step {row.name}", run_id, attributes) as span:
            step: Step | None = None
            error: dict[str, Any] | None
            try:
                step = registry.step(row.name)
            except WorkflowNotRegistered as exc:
                output, error, retryable = None, exc.to_dict(), True
            beats = Beats(run_id, seq, attempt, settings, step.heartbeat_timeout if step else None)
            if step is not None and asyncattempts.detached and asyncsteps.is_async(step.fn):
                info = StepInfo(run_id, seq, attempt, row.name, secret=token)
                launched = asyncattempts.launch(row, step, info, beats, began, read, holder, inline=inline)
                # Held until its outcome is written, from another thread, whenever it ends.
                detached = launched == Attempted.STARTED
                return launched
            if step is not None:
                info = StepInfo(run_id, seq, attempt, row.name, secret=token)
                output, error, retryable = attempts.execute(
                    step, info, row.input, beats, _on_hard_limit(row, step, beats, began)
                )
            tracing.fail(span, error)
            if output is LATER:
                return await_completion(row, holder, beats)
            return record(row, step, output, error, retryable, beats, began, inline=inline, read=read)
    except BaseException as exc:
        if shutdown.is_leaving(exc):
            leases.leave(run_id)
        raise
    finally:
        # Recorded, or it never will be from here: either way this process holds it no longer,
        # and a hold left unrecorded lapses, so the attempt counts as lost and is retried.
        if not detached:
            leases.let_go_attempt(key)


def _on_hard_limit(row: Checkpoint, step: Step, beats: Beats, began: float) -> Callable[[str], bool]:
    """Record the attempt as timed out, from the watchdog thread, before the process ends; the
    next turn goes to a worker (this process is about to end)."""

    def timed_out(why: str) -> bool:
        recorded = record(row, step, None, step_timeout_error(why), True, beats, began, inline=False)
        return recorded in (Attempted.COMPLETED, Attempted.FAILED)

    return timed_out


def _start(
    run_id: str,
    seq: int,
    attempt: int,
    token: str | None,
    holder: str,
    now: datetime,
    settings: conf.Settings,
) -> tuple[Checkpoint | None, flow.Waits | flow.Refused | None, RunAsTaken | None]:
    """Start the attempt (None if the message is stale) and, under a fleet-wide limit, take its
    slot and rate token in the same transaction, or say why it waits instead of running; read
    its run too, for a turn ahead of the result, when ``ahead`` may write one."""
    until = now + settings.LEASE
    if not flow.any_limited():
        row, read = result_and_turn.take(run_id, seq, attempt, token, holder, now, until, settings)
        return row, None, read
    with transaction.atomic(using=settings.DATABASE):
        row, read = result_and_turn.take(run_id, seq, attempt, token, holder, now, until, settings)
        step = registry.steps.get(row.name) if row is not None else None
        if row is None or step is None or not step.limited:
            return row, None, read
        return row, flow.admit_start(row.run_id, row, step, now), None


def await_completion(row: Checkpoint, holder: str, beats: Beats) -> Attempted:
    """The step raised CompleteLater: let the attempt go, open, for ``complete_step``."""
    db = conf.get().DATABASE

    def let_go() -> bool:
        beats.keep_last(Checkpoint.objects.using(db))
        return Checkpoint.objects.using(db).await_completion(
            row.run_id, row.seq, row.attempt, holder, clock.now()
        )

    # Not let go (a database down for good): the hold lapses and the attempt counts as lost.
    return Attempted.LATER if _persistently(let_go, (row.run_id, row.seq, row.attempt)) else Attempted.STALE


def record(
    row: Checkpoint,
    step: Step | None,
    output: Any,
    error: dict[str, Any] | None,
    retryable: bool,
    beats: Beats | None,
    began: float | None = None,
    *,
    inline: bool = True,
    read: RunAsTaken | None = None,
    ahead_only: bool = False,
) -> Attempted:
    """Record one attempt's result exactly once, then wake the run when it should be woken
    (its next turn runs here when ``inline`` and this worker serves the run's queue). ``read``:
    the run as the take read it, for a next turn written with the result (``ahead``); with
    ``ahead_only``, a next turn that cannot be written so is sent, never run here.

    A transient database error is retried (a restart or a cut connection heals in seconds); a
    result the database refuses (say a NUL character) fails the attempt with that reason."""
    settings = conf.get()
    run_id, fan = row.run_id, row.fan
    key = (row.run_id, row.seq, row.attempt)
    claim = next_turn.claim(settings, began) if inline else None
    unsaved = beats is not None and beats.unsaved is not None
    plan = write_plan.result_plan(row, error, unsaved, ahead=read is not None and claim is not None)
    if plan == ResultWrite.WITH_NEXT_TURN and read is not None:
        try:
            written = _persistently(
                lambda: result_and_turn.record(
                    row, read, output, settings, began, lambda: _observe(row, output, None, None)
                ),
                key,
            )
        except BaseException as exc:
            if shutdown.is_leaving(exc):
                # The worker is leaving around the next turn's replay: the result it holds is
                # recorded the usual way, its turn sent, so the step is not run again.
                what = f"record {row.name} {row.run_id}#{row.seq} attempt {row.attempt}"
                leases.while_leaving(what, _record_while_leaving, row, step, output, beats)
            raise
        if written is not None:
            return written
        plan = ResultWrite.WITH_WAKE  # the replay declined: the result and the wake, as usual
    if ahead_only:
        claim, inline = None, False
    outcome = _persistently(
        lambda: _record_once(row, step, output, error, retryable, beats, claim, plan), key
    )
    if outcome is None:
        return Attempted.UNRECORDED
    recorded, woken, joins_later, claimed, history, left = outcome
    if not recorded:
        if claim is not None and (taken := next_turn.claimed_unseen(run_id, claim)) is not None:
            turn.advance_claimed(taken, claim.owner)
        return Attempted.STALE
    if claimed is not None:
        turn.advance_claimed(claimed, claimed.locked_by, history)
    elif joins_later:
        # A fan member wakes the run only once the fan is closed. Asked after this result
        # committed, so the last member always sees it closed (two may: the second turn is a
        # harmless replay).
        woken = _persistently(lambda: _wake_if_closed(run_id, fan, left, settings), key)
        if woken:
            next_turn.run_or_send(run_id, woken, settings, began, inline=inline)
    elif woken and not (claim is not None and attempts.serves(woken)):
        # (A claim refused on a queue served here would be refused to a turn as well: the turn
        # holding the run sees this wake when it settles, or the run is not admitted yet.)
        next_turn.run_or_send(run_id, woken, settings, began, inline=inline)
    return Attempted.COMPLETED if recorded == COMPLETED else Attempted.FAILED


def _record_while_leaving(row: Checkpoint, step: Step | None, output: Any, beats: Beats | None) -> None:
    if record(row, step, output, None, False, beats, inline=False) == Attempted.STALE:
        # Settled already: perhaps by the statement with the next turn, whose send the shutdown
        # cut short.
        lifecycle.resend_unsent(row.run_id)


def _persistently(write: Callable[[], T], key: tuple[str, int, int]) -> T | None:
    """Run ``write`` until it gets through a transient database error; None if it never did."""
    db = conf.get().DATABASE
    for pause in RECORD_TRIES:
        if pause:  # the first try goes at once: even a zero sleep hands the GIL away
            time.sleep(pause)
        try:
            return write()
        except _TRANSIENT:
            log.warning("durable: could not record %s#%s attempt %s yet", *key, exc_info=True)
            connections[db].close()
    return None


def _wake_if_closed(run_id: str, fan: int, left: int | None, settings: conf.Settings) -> str | None:
    if not Checkpoint.objects.using(settings.DATABASE).fan_closed(run_id, fan, left):
        return None
    now = clock.now()
    return Run.objects.using(settings.DATABASE).wake(run_id, now, now + settings.LEASE)


def _record_once(
    row: Checkpoint,
    step: Step | None,
    output: Any,
    error: dict[str, Any] | None,
    retryable: bool,
    beats: Beats | None,
    claim: Claim | None,
    plan: ResultWrite,
) -> _Written:
    """Write the result (``_Written`` says what that did), through a result too large to store."""
    try:
        return _write_result(row, step, output, error, retryable, beats, claim, plan)
    except DataError as exc:
        log.warning(
            "durable: the result of %s#%s attempt %s cannot be stored: %s",
            row.run_id,
            row.seq,
            row.attempt,
            exc,
        )
        unstorable = {
            "message": f"the result of step {row.name!r} could not be stored: {str(exc).strip()[:300]}",
            "type": "UnstorableResult",
            "code": ErrorCode.UNSTORABLE_RESULT,
            "details": None,
        }
        return _write_result(row, step, None, unstorable, False, None, claim, ResultWrite.TRANSACTION)


def _write_result(
    row: Checkpoint,
    step: Step | None,
    output: Any,
    error: dict[str, Any] | None,
    retryable: bool,
    beats: Beats | None,
    claim: Claim | None,
    plan: ResultWrite,
) -> _Written:
    settings = conf.get()
    db = settings.DATABASE
    run_id, seq, attempt = row.run_id, row.seq, row.attempt
    now = clock.now()
    woken: str | None = None  # the run's queue, once a wake reached it
    claimed: Run | None = None
    trace = ""
    if error is not None:
        error, trace = split_traceback(error)
    joins_later = False
    left: int | None = None  # the fan's members still open, when it keeps the count
    retry_at: datetime | None = None
    if plan != ResultWrite.TRANSACTION:  # no transaction of its own needed
        done = Checkpoint.objects.using(db).complete_and_wake(
            run_id, seq, attempt, output, now, now + settings.LEASE, claim, histories.RECORD_FIELDS
        )
        if done.done:
            _observe(row, output, None, None)
        history = (
            histories.Positions(histories.records(done.history), now) if done.history is not None else None
        )
        return _Written(COMPLETED if done.done else None, done.queue, False, done.claimed, history, None)
    with transaction.atomic(using=db):
        checkpoints = Checkpoint.objects.using(db)
        if error is None:
            recorded = checkpoints.complete(run_id, seq, attempt, output, now) and COMPLETED
        elif recorded_retry(step, retryable, attempt):
            # A worker without the step's code retries after the reconcile interval.
            delay = step.retry.delay(attempt) if step is not None else settings.RECONCILE_INTERVAL
            retry_at = now + delay
            recorded = checkpoints.retry_at(run_id, seq, attempt, error, retry_at) and FAILED
        else:
            recorded = checkpoints.fail(run_id, seq, attempt, error, now) and FAILED
        if recorded and beats is not None:
            beats.keep_last(checkpoints)
        if recorded and error is not None:
            AttemptError.objects.using(db).create(
                run_id=run_id,
                seq=seq,
                name=row.name,
                attempt=attempt,
                error=error,
                traceback=trace,
                failed_at=now,
            )
        if recorded:
            _observe(row, output, error, retry_at)
        if recorded:
            settled = error is None or not recorded_retry(step, retryable, attempt)
            if row.fan is not None and settled:
                # Before the run's row is locked below: the order every writer keeps.
                left = Fan.objects.using(db).leave(run_id, row.fan, seq)
            joins_later = row.fan is not None and settled and not (error is not None and row.fail_fast)
            if not joins_later and claim is not None:
                woken, claimed = Run.objects.using(db).wake_and_claim(
                    run_id, now, now + settings.LEASE, claim
                )
            elif not joins_later:
                woken = Run.objects.using(db).wake(run_id, now, now + settings.LEASE)
            if row.flow == HELD and row.flow_key:
                # The attempt ended: its slot goes to the oldest in line, in this transaction
                # (after the run's row, as everywhere a gate is locked).
                flow.hand_off(row.flow_key)
    return _Written(recorded or None, woken, joins_later, claimed, None, left)


def _observe(row: Checkpoint, output: Any, error: dict[str, Any] | None, retry_at: datetime | None) -> None:
    """Report the attempt just recorded, once its transaction commits."""
    loaded = row.__dict__  # a row read with .only(): no query for the fields it left out
    status = COMPLETED if error is None else (PENDING if retry_at is not None else FAILED)
    observe.step_recorded(
        row.run_id,
        row.seq,
        row.name,
        row.attempt,
        queue=loaded.get("queue"),
        enqueued_at=loaded.get("enqueued_at"),
        began=loaded.get("started_at"),
        status=status,
        output=output,
        error=error,
        retry_at=retry_at,
    )


def recorded_retry(step: Step | None, retryable: bool, attempt: int) -> bool:
    """Whether a failed attempt was recorded as a retry (the position stays pending)."""
    return retryable and (step is None or step.retry.allows_after(attempt))
