"""The body of one step attempt, the same wherever it runs: a local step inside the turn, a
dispatched step run in place, or a dispatched step on a worker of its queue.

One implementation, so the same step ends with the same error code on every path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..definitions import Step
from ..errors import InvalidInput, StepCancelled, _ControlFlow, error_dict
from .history import roundtrip
from .stepscope import StepInfo, step_scope

log = logging.getLogger("durable.steps")

#: The most a dead attempt of a step with a heartbeat_timeout may go unnoticed past that timeout.
MAX_BEAT_GRACE = timedelta(seconds=1)

#: (output, error, retryable): the output when the attempt succeeded, else its error and whether
#: the step's retry policy may run another attempt.
Result = tuple[Any, "dict[str, Any] | None", bool]


def run_attempt(
    step: Step,
    info: StepInfo,
    payload: Any,
    beat: Callable[[Any], None],
    *,
    timed_out: tuple[type[BaseException], ...] = (),
) -> Result:
    """Call the step with ``payload`` (``{"args": [...], "kwargs": {...}}``) inside its step scope.

    Error codes: an output that is not JSON is ``invalid_output`` and an ``InvalidInput`` the body
    raises keeps its own code, neither retried; an exception of ``timed_out`` (the executor's time
    limit, such as Celery's soft one) is a ``StepTimeout`` (``timeout``); any other exception,
    KeyboardInterrupt and SystemExit included, is a failed attempt of its type. durable's control
    flow (the turn stops: lease lost, time limit) passes through: the attempt is not over.
    """
    args = payload or {}
    try:
        with step_scope(info, beat):
            output = step.fn(*args.get("args", []), **args.get("kwargs", {}))
    except _ControlFlow:
        raise
    except timed_out:
        return None, step_timeout(f"step {step.name!r} ran past its timeout of {step.timeout}"), True
    except BaseException as exc:  # noqa: BLE001 - any step error, KeyboardInterrupt and SystemExit included, is a failed attempt whose cause is kept
        log.info(
            "durable: step %s of run %s attempt %s failed: %r", step.name, info.run_id, info.attempt, exc
        )
        # A step stopped by its run's cancel is not worth another attempt.
        retryable = step.retry.is_retryable(exc) and not isinstance(exc, (InvalidInput, StepCancelled))
        return None, error_dict(exc), retryable
    try:
        return roundtrip(output, what=f"the output of step {step.name!r}"), None, True
    except InvalidInput as exc:
        return None, {**exc.to_dict(), "code": "invalid_output"}, False


def step_timeout(message: str) -> dict[str, Any]:
    """The stored error of an attempt that overran its timeout or went silent."""
    return {"message": message, "type": "StepTimeout", "code": "timeout", "details": None}


def beat_grace(heartbeat_timeout: timedelta, throttle: timedelta) -> timedelta:
    """How late past ``heartbeat_timeout`` a silent attempt is judged dead, and the persist
    throttle of such a step's beats (instead of HEARTBEAT_PERSIST_THROTTLE): a live step that
    beats within its timeout has a beat persisted within its timeout plus this, so it never looks
    silent, and a dead one is known within its timeout plus this, at most a second."""
    return min(throttle, heartbeat_timeout / 8, MAX_BEAT_GRACE)
