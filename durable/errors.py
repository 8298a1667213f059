"""Exceptions raised by durable, and the control-flow signals of the replay engine.

Errors (``durable.*``; each has a ``code`` and a ``to_dict()`` stored on runs and checkpoints)::

    Exception
    └── DurableError                   durable.errors; the root of every error durable raises
        ├── ApplicationError           raised by user code to fail with a code (non_retryable=)
        ├── _CausedFailure             carries its cause's message, code and details
        │   ├── StepFailed             a step failed for good
        │   ├── ChildFailed            a child run failed for good
        │   ├── GatherError            a member of ctx.all failed (.errors: the failures)
        │   ├── RunFailed              durable.result(): the run failed
        │   └── RunCancelled           durable.result(): the run was cancelled
        ├── WorkerLost                 a step attempt's process died before its result was recorded
        ├── WaitTimeout (TimeoutError) a wait or durable.result() timed out
        ├── StepTimeout (TimeoutError) raised inside a step at its timeout (or heartbeat_timeout)
        ├── NonDeterminismError        the body asked for other than its history holds (parks the run)
        ├── WorkflowNotRegistered      no workflow or step under that name (and version)
        ├── InvalidInput               refused input (code invalid_input; invalid_output for results)
        ├── QueueFull                  a singleton key has too many unfinished runs
        ├── UpdateRejected             an update's validator refused the payload
        ├── Cancelled                  raised in a body at its current wait by cancel(interrupt=True)
        ├── StepCancelled              raised in a step by durable.heartbeat() once its run is
        │                              cancelled with interrupt=True (the attempt fails, cancelled)
        ├── RunNotFound                no run has that id
        ├── RunFinished                the run has already finished
        ├── PayloadUndecodable         a stored payload that the configured codecs cannot decode
        └── PayloadMissing             a payload's object is gone from DURABLE["OFFLOAD_STORAGE"]

Control flow: never an error of the run, and never caught by a body's ``except Exception``::

    BaseException
    └── _ControlFlow                   durable.errors; passes through step attempts untouched
        ├── Suspend                    durable.errors: a primitive cannot answer yet; the turn stops
        ├── ContinueAsNew              durable.replay.composition: ctx.continue_as_new() ends the run
        ├── Interrupted                durable.engine.leases: the turn's lease is gone, or it ran
        │                              past TURN_TIME_LIMIT
        ├── LeaseLost                  durable.engine.turn_writes: the lease was taken over; write nothing
        ├── _DatabaseLost              durable.engine.turn: the database failed a primitive's query
        ├── _Stale                     durable.engine.turn_writes: a guarded write matched no row
        ├── NotAhead                   durable.replay.stopping: a turn replayed before its write
        │   │                          reached what only a turn holding the run may do
        │   └── QueryFailed            durable.engine.result_and_turn: a query the body asked for
        │                              failed there
        ├── _EndOfHistory              durable.replay.check: a replay check walked the whole history
        └── ProcessDied                durable.testing.crashes: durable_env.crash() killed the
                                       test's process at a step attempt

    BaseException
    └── CompleteLater                  durable.errors: raised by a step that another system
                                       completes later with durable.complete_step(token)

Transport: how a remote step's failure leaves the Celery task that ran it (never user-facing)::

    Exception
    └── AttemptFailed                  durable.remote: carries the attempt's error as stored

Stored error types with no class of their own (the ``type`` of an error dict):
``WorkflowTimeout`` (the run passed its deadline) and ``Cancelled`` (a cancelled run). A step
attempt that overran its timeout or went silent is stored as ``StepTimeout``
(``step_timeout_error``) however it ended: raised in the step, or judged from outside.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Every code durable puts on an error it raises (``DurableError.code``) or records (the
    ``"code"`` of a run's, an attempt's or a reply's error). Each member is its string: a code
    read back from the database, or compared with ``"timeout"``, is equal to ``ErrorCode.TIMEOUT``.
    An ``ApplicationError`` carries whatever code the application gives it."""

    #: A step attempt's process died before its result was recorded.
    WORKER_LOST = "worker_lost"
    #: A step ran past its ``timeout`` or gave no heartbeat within ``heartbeat_timeout``.
    TIMEOUT = "timeout"
    #: The body asked for other than its history holds (the run is parked, or failed).
    NON_DETERMINISM = "non_determinism"
    #: An async body awaited something replay cannot repeat (``asyncio.sleep``, a socket...).
    NONDETERMINISTIC_AWAIT = "nondeterministic_await"
    #: A primitive was called from a thread other than the body's.
    WRONG_THREAD = "wrong_thread"
    #: No workflow or step is registered under that name (and version).
    NOT_REGISTERED = "not_registered"
    #: Input refused before anything was stored.
    INVALID_INPUT = "invalid_input"
    #: A step's or body's result that cannot be stored as it is.
    INVALID_OUTPUT = "invalid_output"
    #: A result the database refused (a NUL character, say).
    UNSTORABLE_RESULT = "unstorable_result"
    #: A singleton key has ``max_queue_depth`` unfinished runs already.
    QUEUE_FULL = "queue_full"
    #: An update's validator refused its payload.
    UPDATE_REJECTED = "update_rejected"
    #: The run was cancelled (or, for a step attempt, stopped by an interrupting cancel).
    CANCELLED = "cancelled"
    #: No run has that id.
    NOT_FOUND = "not_found"
    #: The run has finished already.
    FINISHED = "finished"
    #: A stored payload no configured codec can decode.
    PAYLOAD_UNDECODABLE = "payload_undecodable"
    #: A payload's offloaded object is gone from ``OFFLOAD_STORAGE``.
    PAYLOAD_MISSING = "payload_missing"
    #: The run's turns crashed or lost their lease ``MAX_RECOVERY_ATTEMPTS`` times in a row.
    MAX_RECOVERY_ATTEMPTS = "max_recovery_attempts"
    #: A step attempt was sent ``STEP_REDISPATCH_LIMIT`` times and no worker took it.
    REDISPATCH_LIMIT = "redispatch_limit"
    #: A result reported for an attempt that was settled already.
    ALREADY_SETTLED = "already_settled"
    #: A Celery task run as a step failed.
    TASK_FAILED = "task_failed"
    #: A compensation of a saga failed.
    COMPENSATION_FAILED = "compensation_failed"
    #: A step function was called directly instead of through ``ctx.step``.
    STEP_CALLED_DIRECTLY = "step_called_directly"
    #: A plain Celery task used as a step while a codec seals payloads.
    PLAIN_TASK_UNDER_CODEC = "plain_task_under_codec"


class DurableError(Exception):
    """Something went wrong in durable."""

    default_code: str | None = None

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        details: Any = None,
    ) -> None:
        self.message = message if message is not None else (self.__doc__ or "").strip()
        self.code = code if code is not None else self.default_code
        self.details = details
        super().__init__(self.message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Celery pickles exceptions across processes; keyword-only fields need help.
        return (_rebuild, (type(self), self.message, self.__dict__.copy()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "message": storable_text(self.message),
            "type": type(self).__name__,
            "code": self.code,
            "details": self.details,
        }


def _rebuild(cls: type[DurableError], message: str, state: dict[str, Any]) -> DurableError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(state)
    return exc


class ApplicationError(DurableError):
    """The application failed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        details: Any = None,
        non_retryable: bool = False,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.non_retryable = non_retryable


class _CausedFailure(DurableError):
    """Carries the message, code and details of the failure that caused it."""

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        details: Any = None,
        cause: dict[str, Any] | None = None,
    ) -> None:
        cause = cause or {}
        super().__init__(
            message if message is not None else cause.get("message"),
            code=code if code is not None else cause.get("code"),
            details=details if details is not None else cause.get("details"),
        )
        self.cause = cause


class StepFailed(_CausedFailure):
    """A step failed for good."""


class WorkerLost(DurableError):
    """A step attempt ended without a result: the process running it died."""

    default_code = ErrorCode.WORKER_LOST


class ChildFailed(_CausedFailure):
    """A child run failed for good."""


class GatherError(_CausedFailure):
    """A member of a parallel group failed."""

    def __init__(self, errors: list[DurableError] | None = None, **kw: Any) -> None:
        self.errors = list(errors or [])
        first = self.errors[0] if self.errors else None
        kw.setdefault("cause", first.to_dict() if first else None)
        super().__init__(**kw)


class WaitTimeout(DurableError, TimeoutError):
    """The wait timed out."""

    default_code = ErrorCode.TIMEOUT


class StepTimeout(DurableError, TimeoutError):
    """The step ran past its timeout, or gave no heartbeat within its heartbeat_timeout."""

    default_code = ErrorCode.TIMEOUT


class NonDeterminismError(DurableError):
    """The workflow asked for something other than its history holds."""

    default_code = ErrorCode.NON_DETERMINISM


#: Why a body asks for other than its history holds, and what to do: said by the error, the
#: admin, the lifecycle signal's log line and ``manage.py durable replay``.
NON_DETERMINISM_CAUSES = (
    "either the workflow code changed under a running run (a step added, removed or reordered), "
    "or the body is not deterministic: it calls random, reads the clock, iterates a set (or "
    "anything else whose order varies), or reads data outside ctx"
)
NON_DETERMINISM_REMEDY = (
    "use ctx.random(), ctx.uuid4() and ctx.now(), sorted() over sets, and steps for outside data; "
    "ship a change of code behind ctx.patched() or as a new version"
)


def non_determinism_message(seq: int, recorded: tuple[str, str], requested: tuple[str, str]) -> str:
    """What a ``NonDeterminismError`` says: what the body asked for at ``seq``, what the history
    holds there, the usual causes and the remedy. It cannot tell which cause it was."""
    return (
        f"at position {seq} the workflow asked for {requested[0]} {requested[1]!r} where its history "
        f"holds {recorded[0]} {recorded[1]!r}: {NON_DETERMINISM_CAUSES}. Fix: {NON_DETERMINISM_REMEDY}"
    )


class WorkflowNotRegistered(DurableError):
    """No workflow is registered under that name."""

    default_code = ErrorCode.NOT_REGISTERED


class InvalidInput(DurableError):
    """The input is not acceptable."""

    default_code = ErrorCode.INVALID_INPUT


def refuse(field: str, problem: str) -> InvalidInput:
    """The error for a bad ``field``, its message starting with the field: raise what this returns."""
    return InvalidInput(f"{field} {problem}", details={"field": field})


class QueueFull(DurableError):
    """The singleton key has too many unfinished runs."""

    default_code = ErrorCode.QUEUE_FULL


class UpdateRejected(DurableError):
    """The update's validator refused the payload."""

    default_code = ErrorCode.UPDATE_REJECTED


class Cancelled(DurableError):
    """The run was cancelled: clean up in except/finally (steps may run there), then re-raise."""

    default_code = ErrorCode.CANCELLED


class StepCancelled(DurableError):
    """The run of this step was cancelled: stop the work and let the exception escape."""

    default_code = ErrorCode.CANCELLED


class RunNotFound(DurableError):
    """No run has that id."""

    default_code = ErrorCode.NOT_FOUND


class RunFinished(DurableError):
    """The run has already finished."""

    default_code = ErrorCode.FINISHED


class PayloadUndecodable(DurableError):
    """A stored payload cannot be decoded: set DURABLE["CODEC"] and CODEC_KEYS as they were when
    it was written (an old key goes after the first)."""

    default_code = ErrorCode.PAYLOAD_UNDECODABLE


class PayloadMissing(DurableError):
    """A payload written to DURABLE["OFFLOAD_STORAGE"] is not there: point OFFLOAD_STORAGE at the
    storage it was written to, or restore the object from a backup."""

    default_code = ErrorCode.PAYLOAD_MISSING


class RunFailed(_CausedFailure):
    """The run failed."""


class RunCancelled(_CausedFailure):
    """The run was cancelled."""

    default_code = ErrorCode.CANCELLED


class _ControlFlow(BaseException):
    """Interrupts a workflow body; derives from BaseException so user code cannot swallow it."""


class Suspend(_ControlFlow):
    """The body waits for something that has not happened yet."""


class CompleteLater(BaseException):  # noqa: N818 - the name says what the step asks for
    """Raised by a step that handed ``durable.step_info().token`` to another system: the attempt
    stays open (under the step's ``timeout`` / ``heartbeat_timeout``) until that system calls
    ``durable.complete_step(token, ...)``. A BaseException, so a step's ``except Exception``
    around it cannot turn it into a failed attempt."""

    def __init__(self) -> None:
        super().__init__("the step completes later, through durable.complete_step(token, ...)")


def storable_text(text: str) -> str:
    """``text`` with what no database column can hold (NUL, lone surrogates) spelled as escapes,
    so an error that quotes such bytes is still recorded."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


#: The key of a failed attempt's error that carries its traceback until the engine files it
#: apart (AttemptError): the error stored on the position and the run never holds it.
TRACEBACK = "traceback"
#: The most of a failed attempt's traceback kept: its tail, where the exception was raised.
MAX_TRACEBACK_CHARS = 8 * 1024


def bounded_traceback(text: str | None) -> str:
    """``text`` cut to its last MAX_TRACEBACK_CHARS characters, storable in any column."""
    if not text:
        return ""
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "...\n" + text[-MAX_TRACEBACK_CHARS:]
    return storable_text(text)


def error_dict(exc: BaseException) -> dict[str, Any]:
    """Describe any exception as the JSON error shape stored on runs and checkpoints."""
    if isinstance(exc, DurableError):
        return exc.to_dict()
    try:
        code = getattr(exc, "code", None)
    except Exception:  # noqa: BLE001 - a property that raises: the error has no code
        code = None
    return {
        "message": storable_text(_message_of(exc)),
        "type": type(exc).__name__,
        "code": code if isinstance(code, str) else None,
        "details": None,
    }


def _message_of(exc: BaseException) -> str:
    """What ``exc`` says of itself, even when its ``__str__`` (and ``__repr__``) raise: the run
    still fails with the exception's type rather than crash each turn that tries to store it."""
    try:
        return str(exc) or type(exc).__name__
    except Exception as broken:  # noqa: BLE001 - whatever the user's __str__ raised
        why = f"(its __str__ raised {type(broken).__name__})"
    try:
        return f"{exc!r} {why}"
    except Exception:  # noqa: BLE001 - its __repr__ is broken too
        return f"{type(exc).__name__} {why}"


def cancelled_error(reason: str | None = None) -> dict[str, Any]:
    """The error stored on a run cancelled for ``reason`` (and, naming it, on its children)."""
    return {
        "message": reason or "cancelled",
        "type": "Cancelled",
        "code": ErrorCode.CANCELLED,
        "details": None,
    }


def step_timeout_error(message: str) -> dict[str, Any]:
    """The error of a step attempt that overran its timeout or gave no sign of life in time
    (retryable, as any failed attempt, under the step's retry policy)."""
    return {"message": message, "type": "StepTimeout", "code": ErrorCode.TIMEOUT, "details": None}


def turn_time_limit_exhausted(attempts: int, limit: timedelta) -> dict[str, Any]:
    return {
        "message": (
            f"the run's turns crashed {attempts} times in a row, the last one because it ran past "
            f"TURN_TIME_LIMIT ({limit}): a workflow body must reach its next primitive (ctx.step, "
            "ctx.sleep, ...) or end within the limit; move long work into a step"
        ),
        "type": "RecoveryExhausted",
        "code": ErrorCode.MAX_RECOVERY_ATTEMPTS,
        "details": {
            "recovery_attempts": attempts,
            "cause": "turn_time_limit",
            "turn_time_limit": limit.total_seconds(),
        },
    }


def recovery_exhausted(attempts: int) -> dict[str, Any]:
    return {
        "message": f"the run's turns crashed or lost their lease {attempts} times in a row",
        "type": "RecoveryExhausted",
        "code": ErrorCode.MAX_RECOVERY_ATTEMPTS,
        "details": {"recovery_attempts": attempts},
    }
