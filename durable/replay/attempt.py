"""The body of one step attempt, the same wherever it runs: a local step inside the turn, a
dispatched step run in place, or a dispatched step on a worker of its queue.

One implementation, so the same step ends with the same error code on every path.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

from .. import asyncsteps, shutdown
from ..annotated import signature
from ..definitions import Step
from ..errors import (
    TRACEBACK,
    CompleteLater,
    ErrorCode,
    InvalidInput,
    StepCancelled,
    StepTimeout,
    _ControlFlow,
    bounded_traceback,
    error_dict,
    step_timeout_error,
)
from ..values import decode, json_value, stored
from .stepscope import StepInfo, step_scope

log = logging.getLogger("durable.steps")

#: How long past its soft limit an async step still running is abandoned, where no setting says.
DEFAULT_GRACE = 5.0

#: The most a dead attempt of a step with a heartbeat_timeout may go unnoticed past that timeout.
MAX_BEAT_GRACE = timedelta(seconds=1)

#: (output, error, retryable): the output when the attempt succeeded, else its error and whether
#: the step's retry policy may run another attempt.
Result = tuple[Any, "dict[str, Any] | None", bool]


class _Later:
    """The output of an attempt that raised CompleteLater: still open, settled from outside."""

    def __repr__(self) -> str:
        return "LATER"


LATER: Any = _Later()


def split_traceback(error: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The error as stored on the position, and the traceback kept apart from it."""
    if TRACEBACK not in error:
        return error, ""
    kept = dict(error)
    return kept, bounded_traceback(str(kept.pop(TRACEBACK) or ""))


def run_attempt(
    step: Step,
    info: StepInfo,
    payload: Any,
    beat: Callable[[Any], None],
    *,
    timed_out: tuple[type[BaseException], ...] = (),
    max_bytes: int | None = None,
    guard: AbstractContextManager[Any] | None = None,
    grace: float = DEFAULT_GRACE,
    interrupted: Callable[[], bool] | None = None,
) -> Result:
    """Call the step with ``payload`` (``{"args": [...], "kwargs": {...}}``) inside its step scope.

    Error codes: an output that is not JSON is ``invalid_output`` and an ``InvalidInput`` the body
    raises keeps its own code, neither retried; an exception of ``timed_out`` (the executor's time
    limit: durable's own, raised by ``guard``, which encloses the step's code, or Celery's soft one)
    is a ``StepTimeout`` (``timeout``); any other exception,
    KeyboardInterrupt and SystemExit included, is a failed attempt of its type. durable's control
    flow (the turn stops: lease lost, time limit) passes through: the attempt is not over; so does
    what a worker that is shutting down raised (``durable.shutdown``): the attempt is lost.
    ``CompleteLater`` returns ``LATER`` as the output: the attempt stays open for
    ``durable.complete_step``.

    An ``async def`` step is awaited on this process's loop while this thread waits (and serves
    its heartbeats); its limits are kept there (``durable.asyncsteps``), ``grace`` seconds past
    the soft one it is abandoned as timed out, and ``interrupted`` is asked meanwhile whether its
    run was cancelled with interrupt=True.
    """
    positional, named, refused = _arguments(step, payload)
    if refused is not None:
        return refused
    if asyncsteps.is_async(step.fn):

        def awaited() -> Any:
            return start_async(
                step, info, positional, named, beat, grace=grace, interrupted=interrupted
            ).wait()

        return conclude(step, info, awaited, timed_out=(*timed_out, StepTimeout), max_bytes=max_bytes)

    def called() -> Any:
        with step_scope(info, beat), guard or contextlib.nullcontext():
            return step.fn(*positional, **named)

    return conclude(step, info, called, timed_out=timed_out, max_bytes=max_bytes)


def begin_async(
    step: Step,
    info: StepInfo,
    payload: Any,
    beat: Callable[[Any], None],
    *,
    grace: float,
    interrupted: Callable[[], bool] | None,
    host: Callable[[Callable[[], Any]], Any],
    max_bytes: int | None = None,
) -> asyncsteps.Attempt | Result:
    """Start an async step's attempt on this process's loop and return at once (its sync calls
    run through ``host``); the Result instead when it could not start. ``conclude`` it with
    ``attempt.outcome`` once ``attempt.future`` is done."""
    positional, named, refused = _arguments(step, payload)
    if refused is not None:
        return refused
    try:
        return start_async(
            step, info, positional, named, beat, grace=grace, interrupted=interrupted, host=host
        )
    except BaseException as exc:  # noqa: BLE001 - concluded as the attempt's end, below
        failed = exc

    def reraised() -> Any:
        raise failed

    return conclude(step, info, reraised, timed_out=(StepTimeout,), max_bytes=max_bytes)


def start_async(
    step: Step,
    info: StepInfo,
    positional: list[Any],
    named: dict[str, Any],
    beat: Callable[[Any], None],
    *,
    grace: float,
    interrupted: Callable[[], bool] | None,
    host: Callable[[Callable[[], Any]], Any] | None = None,
) -> asyncsteps.Attempt:
    attempt = asyncsteps.Attempt(
        f"step {step.name!r} attempt {info.attempt} of run {info.run_id}",
        timeout=None if step.timeout is None else step.timeout.total_seconds(),
        heartbeat_timeout=None if step.heartbeat_timeout is None else step.heartbeat_timeout.total_seconds(),
        grace=grace,
        beat=beat,
        interrupted=interrupted,
        host=host,
    )
    with step_scope(info, attempt.beat):
        # The coroutine runs on the loop's thread, in a copy of this scope.
        attempt.start(step.fn(*positional, **named), contextvars.copy_context())
    return attempt


def _arguments(step: Step, payload: Any) -> tuple[list[Any], dict[str, Any], Result | None]:
    """The step's arguments from its payload, or the Result of an input its schema refuses."""
    args = payload or {}
    # The arguments as the body passed them: a Decimal stored tagged is a Decimal again.
    positional, named = list(decode(args.get("args", []))), dict(decode(args.get("kwargs", {})))
    # As its annotations say: a dict from a caller or a remote worker is the dataclass it names.
    positional, named = signature(step.fn).arguments(positional, named)
    if step.input_schema is not None:
        try:
            positional, named = _validated_input(step, positional, named)
        except InvalidInput as exc:
            return positional, named, (None, exc.to_dict(), False)
    return positional, named, None


def conclude(
    step: Step,
    info: StepInfo,
    call: Callable[[], Any],
    *,
    timed_out: tuple[type[BaseException], ...] = (),
    max_bytes: int | None = None,
) -> Result:
    """The Result of the attempt whose output ``call()`` returns (or whose error it raises)."""
    try:
        output = call()
    except _ControlFlow:
        raise
    except CompleteLater:
        if step.local or info.secret is None:
            refused = InvalidInput(
                f"step {step.name!r} raised CompleteLater but runs inside the turn (local=True): "
                "a step completed from outside must be dispatched; drop local=True"
            )
            return None, refused.to_dict(), False
        return LATER, None, True
    except timed_out as exc:
        message = str(exc) if isinstance(exc, StepTimeout) and str(exc) != StepTimeout().message else ""
        return (
            None,
            step_timeout_error(message or f"step {step.name!r} ran past its timeout of {step.timeout}"),
            True,
        )
    except BaseException as exc:  # noqa: BLE001 - any step error, KeyboardInterrupt and SystemExit included, is a failed attempt whose cause is kept
        if shutdown.is_leaving(exc):
            raise  # the worker is shutting down: the attempt is lost with its process, not failed
        log.info(
            "durable: step %s of run %s attempt %s failed: %r", step.name, info.run_id, info.attempt, exc
        )
        # A step stopped by its run's cancel is not worth another attempt.
        retryable = step.retry.is_retryable(exc) and not isinstance(exc, (InvalidInput, StepCancelled))
        # The traceback goes to the attempt's history (AttemptError), not to the error the
        # workflow and the run see: see TRACEBACK.
        return None, {**error_dict(exc), TRACEBACK: bounded_traceback(traceback.format_exc())}, retryable
    try:
        if step.output_schema is not None:
            output = _validated_output(step, output)
        return stored(output, what=f"the output of step {step.name!r}", max_bytes=max_bytes), None, True
    except InvalidInput as exc:
        return None, {**exc.to_dict(), "code": ErrorCode.INVALID_OUTPUT}, False


def _validated_input(
    step: Step, positional: list[Any], named: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The step's one argument as its ``input_schema`` makes it (the history keeps it as sent)."""
    if positional:
        return [_validate(step.input_schema, positional[0], f"the input of step {step.name!r}")], named
    if len(named) != 1:
        return positional, named  # called with the wrong arguments: the call itself says so
    ((key, value),) = named.items()
    return positional, {key: _validate(step.input_schema, value, f"the input of step {step.name!r}")}


def _validated_output(step: Step, output: Any) -> Any:
    """The output once its ``output_schema`` accepted it, as JSON (a model is dumped)."""
    model = _validate(step.output_schema, output, f"the output of step {step.name!r}")
    dump = getattr(model, "model_dump", None)
    return dump(mode="json") if callable(dump) else output


def _validate(schema: Any, value: Any, what: str) -> Any:
    try:
        return schema.model_validate(value)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, or whatever a schema raises
        raise InvalidInput(f"{what} does not fit its schema: {exc}", details=_details(exc)) from None


def _details(exc: Exception) -> Any:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return None
    try:
        return json_value(errors(include_url=False, include_input=False), "validation errors")
    except Exception:  # noqa: BLE001 - a schema library's own error shape: its message is enough
        return None


def beat_grace(heartbeat_timeout: timedelta, throttle: timedelta) -> timedelta:
    """How late past ``heartbeat_timeout`` a silent attempt is judged dead, and the persist
    throttle of such a step's beats (instead of HEARTBEAT_PERSIST_THROTTLE): a live step that
    beats within its timeout has a beat persisted within its timeout plus this, so it never looks
    silent, and a dead one is known within its timeout plus this, at most a second."""
    return min(throttle, heartbeat_timeout / 8, MAX_BEAT_GRACE)
