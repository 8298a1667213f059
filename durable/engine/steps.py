"""Execute one dispatched step attempt on a worker and record its result exactly once.

A duplicate or stale delivery finds the attempt no longer pending and changes nothing.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DataError, InterfaceError, OperationalError, connections, transaction

from .. import clock, conf, dispatch, tracing
from ..definitions import Step, registry
from ..errors import (
    TRACEBACK,
    DurableError,
    InvalidInput,
    WorkflowNotRegistered,
    error_dict,
    step_timeout_error,
)
from ..models import HELD, AttemptError, Checkpoint, Claim, Run
from ..models.ahead import Ahead
from ..replay.attempt import LATER, beat_grace, split_traceback
from ..replay.history import COMPLETED, FAILED, PENDING, Record, check_size, roundtrip
from ..replay.stepscope import StepInfo, parse_token
from . import ahead, attempts, flow, handover, histories, leases, observe, turn
from .attempts import Beats

T = TypeVar("T")
#: (how it was recorded or None, the woken run's queue, whether a fan joins later, the claimed
#: run, its positions if read with the claim)
_Written = tuple[str | None, str | None, bool, Run | None, dict[int, Record] | None]

log = logging.getLogger("durable.engine")

#: How often recording a result is tried before the attempt is left to lapse, and the pause
#: before each retry: a database restart or a cut connection heals within seconds.
RECORD_TRIES = (0.0, 0.5, 1.0, 2.0, 4.0)
_TRANSIENT = (OperationalError, InterfaceError)
#: What settling an attempt from a message reads of its checkpoint (and of its run).
_ATTEMPT_FIELDS = (
    "seq",
    "name",
    "status",
    "attempt",
    "fan",
    "fail_fast",
    "token",
    "flow",
    "flow_key",
    "run__status",
)


def _task_attempt(run_id: str, seq: int, attempt: int, token: str | None, db: str) -> Checkpoint | None:
    """The checkpoint of this attempt of a Celery task used as a step, if ``token`` is the one
    durable sent with it and the attempt is still pending in an unfinished run."""
    row = (
        Checkpoint.objects.using(db)
        .select_related("run")
        .filter(run_id=run_id, seq=seq)
        .only("input", *_ATTEMPT_FIELDS)
        .first()
    )
    if row is None or row.status != PENDING or row.attempt != attempt or row.run.is_finished:
        return None
    # Results of durable's own steps are recorded by the worker that ran them, never by a message.
    if not reported_by_message(row.input) or not _same_token(row.token, token):
        log.warning(
            "durable: refused a result for %s#%s attempt %s: not a Celery task or remote step, "
            "or not the token durable sent with it",
            run_id,
            seq,
            attempt,
        )
        return None
    return row


def reported_by_message(payload: Any) -> bool:
    """Whether an attempt's result and heartbeats come as messages: a Celery task or a remote step."""
    return bool(payload) and bool(payload.get("task") or payload.get("remote"))


def _same_token(expected: str | None, given: str | None) -> bool:
    if expected is None or given is None:
        return expected is given
    return hmac.compare_digest(expected, given)


def run_step(run_id: str, seq: int, attempt: int, token: str | None = None) -> str:
    """Run attempt ``attempt`` of the step at position ``seq`` of ``run_id``, record the result.

    The attempt is held by this process (renewed by the lease keeper) from the moment it starts
    until its result is recorded, so a death anywhere in between is known within a LEASE."""
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
        return "stale"
    if isinstance(held_back, flow.Waits):
        if held_back.until is not None:
            flow.wake_for_token(run_id, held_back.until)
        return "waiting"  # or sent again when a slot is handed to it
    if isinstance(held_back, flow.Refused):
        return record(row, registry.step(row.name), None, held_back.error, False, None, began)
    leases.hold_attempt(key, holder)
    observe.step_started(row, row.started_at)
    attributes = {
        "durable.run_id": run_id,
        "durable.seq": seq,
        "durable.step": row.name,
        "durable.attempt": attempt,
    }
    try:
        with tracing.span(f"durable.step {row.name}", run_id, attributes) as span:
            step: Step | None = None
            try:
                step = registry.step(row.name)
            except WorkflowNotRegistered as exc:
                output, error, retryable = None, exc.to_dict(), True
            beats = Beats(run_id, seq, attempt, settings, step.heartbeat_timeout if step else None)
            if step is not None:
                info = StepInfo(run_id, seq, attempt, row.name, secret=token)
                output, error, retryable = attempts.execute(
                    step, info, row.input, beats, _on_hard_limit(row, step, beats, began)
                )
            tracing.fail(span, error)
            if output is LATER:
                return _await_completion(row, holder, beats)
            return record(row, step, output, error, retryable, beats, began, read=read)
    finally:
        # Recorded, or it never will be from here: either way this process holds it no longer,
        # and a hold left unrecorded lapses, so the attempt counts as lost and is retried.
        leases.let_go_attempt(key)


def _on_hard_limit(row: Checkpoint, step: Step, beats: Beats, began: float) -> Callable[[str], bool]:
    """Record the attempt as timed out, from the watchdog thread, before the process ends; the
    next turn goes to a worker (this process is about to end)."""

    def timed_out(why: str) -> bool:
        recorded = record(row, step, None, step_timeout_error(why), True, beats, began, inline=False)
        return recorded in ("completed", "failed")

    return timed_out


def _start(
    run_id: str,
    seq: int,
    attempt: int,
    token: str | None,
    holder: str,
    now: datetime,
    settings: conf.Settings,
) -> tuple[Checkpoint | None, flow.Waits | flow.Refused | None, Ahead | None]:
    """Start the attempt (None if the message is stale) and, under a fleet-wide limit, take its
    slot and rate token in the same transaction, or say why it waits instead of running; read
    its run too, for a turn ahead of the result, when ``ahead`` may write one."""
    until = now + settings.LEASE
    if not flow.any_limited():
        row, read = ahead.take(run_id, seq, attempt, token, holder, now, until, settings)
        return row, None, read
    with transaction.atomic(using=settings.DATABASE):
        row, read = ahead.take(run_id, seq, attempt, token, holder, now, until, settings)
        step = registry.steps.get(row.name) if row is not None else None
        if row is None or step is None or not step.limited:
            return row, None, read
        return row, flow.admit_start(row, step, now), None


def _await_completion(row: Checkpoint, holder: str, beats: Beats) -> str:
    """The step raised CompleteLater: let the attempt go, open, for ``complete_step``."""
    db = conf.get().DATABASE

    def let_go() -> bool:
        beats.keep_last(Checkpoint.objects.using(db))
        return Checkpoint.objects.using(db).await_completion(row.run_id, row.seq, row.attempt, holder)

    # Not let go (a database down for good): the hold lapses and the attempt counts as lost.
    return "later" if _persistently(let_go, (row.run_id, row.seq, row.attempt)) else "stale"


def complete_step(token: Any, output: Any = None, error: Any = None) -> None:
    """Settle the attempt that raised CompleteLater and handed out ``token``: with ``output``,
    or failed with ``error`` (an exception, or an error dict / message), under the step's retry
    policy. A wrong token, or one whose attempt is settled already, changes nothing and raises."""
    settings = conf.get()
    run_id, seq, attempt, secret = parse_token(token)
    row = (
        Checkpoint.objects.using(settings.DATABASE)
        .select_related("run")
        .filter(run_id=run_id, seq=seq, kind="step")
        .only("run_id", *_ATTEMPT_FIELDS)
        .first()
    )
    if row is None or not _same_token(row.token, secret) or row.attempt != attempt:
        raise InvalidInput(
            "this completion token matches no open step attempt: it is not one durable handed out, "
            "or its attempt has ended and been retried; nothing changed"
        )
    if row.status != PENDING or row.run.is_finished:
        raise DurableError(
            f"step {row.name!r} of run {run_id!r} (attempt {attempt}) was settled already "
            f"({row.status}, run {row.run.status}); nothing changed",
            code="already_settled",
        )
    try:
        step: Step | None = registry.step(row.name)
    except WorkflowNotRegistered:
        step = None  # retried once a process with the step's code runs the run
    retryable = True
    if error is None:
        output = roundtrip(output, what=f"the output of step {row.name!r}")
        check_size(output, settings.MAX_PAYLOAD_BYTES, what=f"the output of step {row.name!r}")
    elif isinstance(error, BaseException):
        retryable = step is None or step.retry.is_retryable(error)
        error = error_dict(error)
    else:
        error = _error_shape(error)
    recorded = record(row, step, None if error is not None else output, error, retryable, None)
    if recorded == "unrecorded":
        raise DurableError(f"could not record the completion of step {row.name!r} now; try again")
    if recorded == "stale":
        raise DurableError(
            f"step {row.name!r} of run {run_id!r} (attempt {attempt}) was settled meanwhile; nothing changed",
            code="already_settled",
        )


def step_result(
    run_id: str, seq: int, attempt: int, output: Any = None, error: Any = None, token: str | None = None
) -> str:
    """Record the result a Celery task (or a worker in another language) reports for a step;
    sent with only a completion token (no ``run_id``), it completes a step that raised
    CompleteLater."""
    if not run_id and token:
        try:
            complete_step(token, output, error)
        except DurableError as exc:
            log.warning("durable: refused a step completion sent as a message: %s", exc)
            return "stale"
        return "failed" if error is not None else "completed"
    settings = conf.get()
    row = _task_attempt(run_id, seq, attempt, token, settings.DATABASE)
    if row is None:
        return "stale"
    # A Celery task retries by its own settings: what reaches durable is its final result. A
    # remote step's failed attempt is retried by the step's policy, as a durable step's is.
    remote = bool((row.input or {}).get("remote"))
    step = registry.known_step(row.name) if remote else None
    retryable = remote
    if error is not None:
        error = _error_shape(error)
        retryable = remote and (step is None or _retryable(step, error))
    else:
        try:
            output = roundtrip(output, what=f"the result of task {row.name!r}")
            check_size(output, settings.MAX_PAYLOAD_BYTES, what=f"the result of task {row.name!r}")
        except InvalidInput as exc:
            error, retryable = {**exc.to_dict(), "code": "invalid_output"}, False
    return record(row, step, output, error, retryable, None)


def task_failed(run_id: str, seq: int, attempt: int, failure: tuple[Any, ...], token: str | None) -> str:
    """Record the failure of a Celery task used as a step, as its ``link_error`` reports it:
    ``(request, exc, traceback)`` from a worker that has durable installed, or only the task's
    id from one that has not (its exception is then read from the result backend, if this
    process shares it, else the error says where to look).

    Called in place, it forwards the failure as a ``durable.step_result`` message to the queue
    the task's ``durable_attempt`` header names: the failing worker may have durable installed
    and still no database (a remote box)."""
    if len(failure) >= 2 and isinstance(failure[1], BaseException):
        # A remote step run by durable's runner (durable.remote) raises its error as stored.
        error = getattr(failure[1], "durable_error", None) or error_dict(failure[1])
        if len(failure) >= 3 and isinstance(failure[2], str):
            error = {**error, TRACEBACK: failure[2]}  # filed with the attempt's history
        where = dispatch.attempt_of(failure[0])
        if where is not None:
            dispatch.step_result_from(where, error)
            return "forwarded"
    else:
        task_id = failure[0] if failure and isinstance(failure[0], str) else None
        error = dispatch.reported_failure(task_id) if task_id else None
        if error is None:
            error = {
                "message": f"the Celery task failed on a worker without durable installed (task id "
                f"{task_id}); its exception is in that worker's log and result backend",
                "type": "TaskFailed",
                "code": "task_failed",
                "details": {"task_id": task_id},
            }
    return step_result(run_id, seq, attempt, error=error, token=token)


def _retryable(step: Step, error: dict[str, Any]) -> bool:
    """Whether the step's retry policy retries a failure reported as ``error``: not when the
    worker marked it ``non_retryable``, nor when its type is listed in ``Retry(non_retryable=)``
    (compared by name: the exception class lives in the worker's process)."""
    if error.get("non_retryable") is True:
        return False
    kind = error.get("type")
    for entry in step.retry.non_retryable:
        names = (
            {entry}
            if isinstance(entry, str)
            else {entry.__name__, f"{entry.__module__}.{entry.__qualname__}"}
        )
        if kind in names or (isinstance(entry, str) and entry.rpartition(".")[2] == kind):
            return False
    return True


def _error_shape(error: Any) -> dict[str, Any]:
    """The stored error shape from whatever a foreign worker sent as an error."""
    if not isinstance(error, dict):
        return {"message": str(error), "type": "Error", "code": None, "details": None}
    shaped = {
        "message": str(error.get("message") or error.get("type") or "the task failed"),
        "type": str(error.get("type") or "Error"),
        "code": error.get("code") if isinstance(error.get("code"), str) else None,
        "details": error.get("details"),
    }
    if isinstance(error.get(TRACEBACK), str):
        shaped[TRACEBACK] = error[TRACEBACK]  # filed with the attempt's history, not the error
    if error.get("non_retryable") is True:
        shaped["non_retryable"] = True
    try:
        return roundtrip(shaped, what="the error")
    except InvalidInput:
        return {**shaped, "details": None}


def heartbeat(run_id: str, seq: int, attempt: int, progress: Any = None, token: str | None = None) -> bool:
    """A beat sent as a message by a worker that only speaks Celery, with the attempt's token.

    False (nothing recorded) when the beat is not this attempt's to give, or when the step's run
    was cancelled with ``interrupt=True``: either way, a caller that reads it should stop."""
    settings = conf.get()
    db = settings.DATABASE
    try:
        progress = None if progress is None else roundtrip(progress, what="heartbeat progress")
        if progress is not None:
            check_size(progress, settings.MAX_PAYLOAD_BYTES, what="heartbeat progress")
    except InvalidInput as exc:
        log.warning("durable: heartbeat for %s#%s dropped: %s", run_id, seq, exc)
        return False
    row = _task_attempt(run_id, seq, attempt, token, db)
    if row is None:
        _keep_late_progress(run_id, seq, attempt, token, progress, db)
        return False
    if Run.objects.using(db).interrupted(run_id, seq):
        return False
    # The beat proves the attempt started and its worker alive: it is held until the beat's
    # window ends, so it is neither sent again nor, once the beats stop, waited on forever.
    now = clock.now()
    beaten = Checkpoint.objects.using(db).beat_from_message(
        run_id,
        seq,
        attempt,
        token,
        now,
        now + _beat_window(row.name, settings),
        progress,
        progress is not None,
    )
    if not beaten:
        # The result was recorded between the read above and this write (another process of
        # the worker took it meanwhile).
        _keep_late_progress(run_id, seq, attempt, token, progress, db)
    return beaten


def _keep_late_progress(
    run_id: str, seq: int, attempt: int, token: str | None, progress: Any, db: str
) -> None:
    """A beat sent before the result but taken after it (two processes, or no order between
    queues): the attempt's last progress is still kept, as for any step."""
    if progress is not None and token:
        Checkpoint.objects.using(db).late_progress(run_id, seq, attempt, token, progress)


def _beat_window(name: str, settings: conf.Settings) -> timedelta:
    """How long one beat message keeps an attempt alive: STEP_REDISPATCH_AFTER, the time an
    unstarted attempt is given, or the step's heartbeat_timeout with its grace when longer."""
    step = registry.known_step(name)
    window = settings.STEP_REDISPATCH_AFTER
    if step is not None and step.heartbeat_timeout is not None:
        grace = beat_grace(step.heartbeat_timeout, settings.HEARTBEAT_PERSIST_THROTTLE)
        window = max(window, step.heartbeat_timeout + grace)
    return window


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
    read: Ahead | None = None,
) -> str:
    """Record one attempt's result exactly once, then wake the run when it should be woken
    (its next turn runs here when ``inline`` and this worker serves the run's queue). ``read``:
    the run as the take read it, for a next turn written with the result (``ahead``).

    A transient database error is retried (a restart or a cut connection heals in seconds); a
    result the database refuses (say a NUL character) fails the attempt with that reason."""
    settings = conf.get()
    run_id, fan = row.run_id, row.fan
    key = (row.run_id, row.seq, row.attempt)
    claim = handover.claim(settings, began) if inline else None
    if read is not None and claim is not None and _common_end(row, error, beats):
        written = _persistently(
            lambda: ahead.record(
                row, read, output, settings, began, lambda: _observe(row, output, None, None)
            ),
            key,
        )
        if written is not None:
            return written
    outcome = _persistently(lambda: _record_once(row, step, output, error, retryable, beats, claim), key)
    if outcome is None:
        return "unrecorded"
    recorded, woken, joins_later, claimed, history = outcome
    if not recorded:
        if claim is not None and (taken := handover.claimed_unseen(run_id, claim)) is not None:
            turn.advance_claimed(taken, claim.owner)
        return "stale"
    if claimed is not None:
        turn.advance_claimed(claimed, claimed.locked_by, history)
    elif joins_later:
        # A fan member wakes the run only once the fan is closed. Asked after this result
        # committed, so the last member always sees it closed (two may: the second turn is a
        # harmless replay).
        woken = _persistently(lambda: _wake_if_closed(run_id, fan, settings), key)
        if woken:
            handover.next_turn(run_id, woken, settings, began, inline=inline)
    elif woken and not (claim is not None and attempts.serves(woken)):
        # (A claim refused on a queue served here would be refused to a turn as well: the turn
        # holding the run sees this wake when it settles, or the run is not admitted yet.)
        handover.next_turn(run_id, woken, settings, began, inline=inline)
    return "completed" if recorded == COMPLETED else "failed"


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


def _wake_if_closed(run_id: str, fan: int, settings: conf.Settings) -> str | None:
    if not Checkpoint.objects.using(settings.DATABASE).fan_closed(run_id, fan):
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
) -> _Written:
    """(how it was recorded or None if stale, the woken run's queue, whether a fan joins later,
    the run if ``claim`` took its lease, and its history if read with the claim)."""
    try:
        return _write_result(row, step, output, error, retryable, beats, claim)
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
            "code": "unstorable_result",
            "details": None,
        }
        return _write_result(row, step, None, unstorable, False, None, claim)


def _write_result(
    row: Checkpoint,
    step: Step | None,
    output: Any,
    error: dict[str, Any] | None,
    retryable: bool,
    beats: Beats | None,
    claim: Claim | None,
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
    retry_at: datetime | None = None
    if _common_end(row, error, beats):  # no transaction of its own needed
        done = Checkpoint.objects.using(db).complete_and_wake(
            run_id, seq, attempt, output, now, now + settings.LEASE, claim, histories.RECORD_FIELDS
        )
        if done.done:
            _observe(row, output, None, None)
        history = histories.records(done.history) if done.history is not None else None
        return (COMPLETED if done.done else None), done.queue, False, done.claimed, history
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
    return recorded or None, woken, joins_later, claimed, None


def _common_end(row: Checkpoint, error: dict[str, Any] | None, beats: Beats | None) -> bool:
    """Whether the attempt ends the common way: completed, outside a fan and a limit, no
    progress left unsaved. Its result and the wake (and claim) are then all there is to write."""
    return error is None and row.fan is None and (beats is None or beats.unsaved is None) and not row.flow_key


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
