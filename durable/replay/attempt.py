"""The body of one step attempt, the same wherever it runs: a local step inside the turn, a
dispatched step run in place, or a dispatched step on a worker of its queue.

One implementation, so the same step ends with the same error code on every path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..definitions import Step
from ..errors import CompleteLater, InvalidInput, _ControlFlow, error_dict
from .history import roundtrip
from .stepscope import StepInfo, step_scope

log = logging.getLogger("durable.steps")

#: (output, error, retryable): the output when the attempt succeeded, else its error and whether
#: the step's retry policy may run another attempt.
Result = tuple[Any, "dict[str, Any] | None", bool]


class _Later:
    """The output of an attempt that raised CompleteLater: still open, settled from outside."""

    def __repr__(self) -> str:
        return "LATER"


LATER: Any = _Later()


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
    ``CompleteLater`` returns ``LATER`` as the output: the attempt stays open for
    ``durable.complete_step``.
    """
    args = payload or {}
    try:
        with step_scope(info, beat):
            output = step.fn(*args.get("args", []), **args.get("kwargs", {}))
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
    except timed_out:
        return None, step_timeout(f"step {step.name!r} ran past its timeout of {step.timeout}"), True
    except BaseException as exc:  # noqa: BLE001 - any step error, KeyboardInterrupt and SystemExit included, is a failed attempt whose cause is kept
        log.info(
            "durable: step %s of run %s attempt %s failed: %r", step.name, info.run_id, info.attempt, exc
        )
        return None, error_dict(exc), step.retry.is_retryable(exc) and not isinstance(exc, InvalidInput)
    try:
        return roundtrip(output, what=f"the output of step {step.name!r}"), None, True
    except InvalidInput as exc:
        return None, {**exc.to_dict(), "code": "invalid_output"}, False


def step_timeout(message: str) -> dict[str, Any]:
    """The stored error of an attempt that overran its timeout or went silent."""
    return {"message": message, "type": "StepTimeout", "code": "timeout", "details": None}
