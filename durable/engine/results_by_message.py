"""Results, failures and beats that arrive as messages, for step attempts this process did not
run: a Celery task used as a step, a remote step, a step settled later with its completion token.
Unlike the result of an attempt a worker runs itself (``steps.run_step``), such a report may be
late, repeated, forged or meant for an attempt retried since, and its error comes in whatever shape
a foreign worker sent; so it is checked against the token durable sent with the attempt, and the
attempt's state, before anything is written, then recorded by ``steps.record`` like any result.
"""

from __future__ import annotations

import hmac
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import clock, codecs, conf, dispatch, routing
from ..definitions import Step, registry
from ..errors import (
    TRACEBACK,
    DurableError,
    ErrorCode,
    InvalidInput,
    PayloadUndecodable,
    WorkflowNotRegistered,
    error_dict,
)
from ..models import Checkpoint, Run
from ..replay.attempt import beat_grace
from ..replay.history import PENDING
from ..replay.stepscope import parse_token
from ..statuses import Attempted
from ..values import json_value
from . import namespaces
from .steps import record

log = logging.getLogger("durable.engine")

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
    "run__namespace",
)


def _task_attempt(run_id: str, seq: int, attempt: int, token: str | None, db: str) -> Checkpoint | None:
    """The checkpoint of this attempt of a Celery task used as a step, if ``token`` is the one
    durable sent with it and the attempt is still pending in an unfinished run."""
    if not token:
        log.warning(
            "durable: refused a message for %s#%s attempt %s: it carries no token", run_id, seq, attempt
        )
        return None
    row = (
        Checkpoint.objects.using(db)
        .select_related("run")
        .filter(run_id=run_id, seq=seq)
        .only("input", *_ATTEMPT_FIELDS)
        .first()
    )
    if row is None or row.status != PENDING or row.attempt != attempt or row.run.is_finished:
        return None
    if not routing.serves(conf.get().NAMESPACE, row.run.namespace):
        namespaces.warn(run_id, f"a report for step attempt {seq}#{attempt}", row.run.namespace, conf.get())
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


def _same_token(expected: str | None, given: Any) -> bool:
    # An attempt between two sends has no token: a message without one must match nothing.
    if not expected or not given or not isinstance(given, str):
        return False
    return hmac.compare_digest(expected, given)


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
            code=ErrorCode.ALREADY_SETTLED,
        )
    try:
        step: Step | None = registry.step(row.name)
    except WorkflowNotRegistered:
        step = None  # retried once a process with the step's code runs the run
    retryable = True
    if error is None:
        output = json_value(output, f"the output of step {row.name!r}", max_bytes=settings.MAX_PAYLOAD_BYTES)
    elif isinstance(error, BaseException):
        retryable = step is None or step.retry.is_retryable(error)
        error = error_dict(error)
    else:
        error = _error_shape(error)
    recorded = record(row, step, None if error is not None else output, error, retryable, None)
    if recorded == Attempted.UNRECORDED:
        raise DurableError(f"could not record the completion of step {row.name!r} now; try again")
    if recorded == Attempted.STALE:
        raise DurableError(
            f"step {row.name!r} of run {run_id!r} (attempt {attempt}) was settled meanwhile; nothing changed",
            code=ErrorCode.ALREADY_SETTLED,
        )


def heartbeat_step(token: Any, progress: Any = None) -> bool:
    """A beat for the attempt that raised CompleteLater and handed out ``token`` (see
    ``durable.heartbeat_step``): the attempt's last beat is now, for its heartbeat_timeout."""
    settings = conf.get()
    run_id, seq, attempt, secret = parse_token(token)
    if progress is not None:
        progress = json_value(progress, "heartbeat progress", max_bytes=settings.MAX_PAYLOAD_BYTES)
    positions = Checkpoint.objects.using(settings.DATABASE)
    row = (
        positions.select_related("run")
        .filter(run_id=run_id, seq=seq, kind="step")
        .only(*_ATTEMPT_FIELDS)
        .first()
    )
    if row is None or not _same_token(row.token, secret) or row.attempt != attempt:
        raise InvalidInput(
            "this token matches no open step attempt: it is not one durable handed out, or its "
            "attempt has ended and been retried; nothing changed"
        )
    if (
        row.status != PENDING
        or row.run.is_finished
        or Run.objects.using(settings.DATABASE).interrupted(run_id, seq)
    ):
        return False
    return positions.beat_later(run_id, seq, attempt, row.token, clock.now(), progress)


def step_result(
    run_id: str, seq: int, attempt: int, output: Any = None, error: Any = None, token: str | None = None
) -> Attempted:
    """Record the result a Celery task (or a worker in another language) reports for a step;
    sent with only a completion token (no ``run_id``), it completes a step that raised
    CompleteLater. Its output may come sealed under the codec (as a remote worker sends it):
    one that no key opens is refused like a forged report, and the attempt stays open."""
    try:
        output = codecs.opened(output, conf.codec())
    except PayloadUndecodable as exc:
        log.warning(
            "durable: refused a result for %s#%s attempt %s (%s): %s", run_id, seq, attempt, exc.code, exc
        )
        return Attempted.STALE
    if not run_id and token:
        try:
            complete_step(token, output, error)
        except DurableError as exc:
            log.warning("durable: refused a step completion sent as a message: %s", exc)
            return Attempted.STALE
        return Attempted.FAILED if error is not None else Attempted.COMPLETED
    settings = conf.get()
    row = _task_attempt(run_id, seq, attempt, token, settings.DATABASE)
    if row is None:
        return Attempted.STALE
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
            output = json_value(
                output, f"the result of task {row.name!r}", max_bytes=settings.MAX_PAYLOAD_BYTES
            )
        except InvalidInput as exc:
            error, retryable = {**exc.to_dict(), "code": ErrorCode.INVALID_OUTPUT}, False
    return record(row, step, output, error, retryable, None)


def task_failed(
    run_id: str, seq: int, attempt: int, failure: tuple[Any, ...], token: str | None
) -> Attempted:
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
            return Attempted.FORWARDED
    else:
        task_id = failure[0] if failure and isinstance(failure[0], str) else None
        error = dispatch.reported_failure(task_id) if task_id else None
        if error is None:
            error = {
                "message": f"the Celery task failed on a worker without durable installed (task id "
                f"{task_id}); its exception is in that worker's log and result backend",
                "type": "TaskFailed",
                "code": ErrorCode.TASK_FAILED,
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
        return json_value(shaped, "the error")
    except InvalidInput:
        return {**shaped, "details": None}


def heartbeat(
    run_id: str,
    seq: int,
    attempt: int,
    progress: Any = None,
    token: str | None = None,
    sent_at: Any = None,
) -> bool:
    """A beat sent as a message by a worker that only speaks Celery, with the attempt's token
    and, from senders that say it, when it was sent (seconds since the epoch): two processes
    may take an attempt's beats in either order, and the progress kept is the last one sent.

    False (nothing recorded) when the beat is not this attempt's to give, or when the step's run
    was cancelled with ``interrupt=True``: either way, a caller that reads it should stop."""
    settings = conf.get()
    db = settings.DATABASE
    sent = _sent_at(sent_at)
    try:
        progress = codecs.opened(progress, conf.codec())  # a remote worker seals it under a codec
        if progress is not None:
            progress = json_value(progress, "heartbeat progress", max_bytes=settings.MAX_PAYLOAD_BYTES)
    except (InvalidInput, PayloadUndecodable) as exc:
        log.warning("durable: heartbeat for %s#%s dropped: %s", run_id, seq, exc)
        return False
    row = _task_attempt(run_id, seq, attempt, token, db)
    if row is None:
        _keep_late_progress(run_id, seq, attempt, token, progress, sent, db)
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
        sent,
    )
    if not beaten:
        # The result was recorded between the read above and this write (another process of
        # the worker took it meanwhile).
        _keep_late_progress(run_id, seq, attempt, token, progress, sent, db)
    return beaten


def _sent_at(value: Any) -> datetime | None:
    """A beat's ``sent_at`` (seconds since the epoch) as a time; None when absent or not one
    (its progress is then kept as it comes, as from a sender that does not say)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _keep_late_progress(
    run_id: str, seq: int, attempt: int, token: str | None, progress: Any, sent: datetime | None, db: str
) -> None:
    """A beat sent before the result but taken after it (two processes, or no order between
    queues): the attempt's last progress is still kept, as for any step."""
    if progress is not None and token:
        Checkpoint.objects.using(db).late_progress(run_id, seq, attempt, token, progress, sent)


def _beat_window(name: str, settings: conf.Settings) -> timedelta:
    """How long one beat message keeps an attempt alive: STEP_REDISPATCH_AFTER, the time an
    unstarted attempt is given, or the step's heartbeat_timeout with its grace when longer."""
    step = registry.known_step(name)
    window = settings.STEP_REDISPATCH_AFTER
    if step is not None and step.heartbeat_timeout is not None:
        grace = beat_grace(step.heartbeat_timeout, settings.HEARTBEAT_PERSIST_THROTTLE)
        window = max(window, step.heartbeat_timeout + grace)
    return window
