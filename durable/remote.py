"""Remote steps served by a Python worker that has durable installed but maybe no database.

Each remote step this process knows becomes a Celery task under the step's name: it runs the
step's body in a step scope whose heartbeats leave as ``durable.heartbeat`` messages. Its result
goes back the way any Celery task used as a step reports: the message's ``link`` on success, its
``link_error`` on failure (forwarded as a ``durable.step_result`` message, see
``engine.steps.task_failed``). Nothing here touches the database.
"""

from __future__ import annotations

from typing import Any

from . import conf, dispatch
from .definitions import Step, registry
from .replay.attempt import run_attempt
from .replay.stepscope import StepInfo

# As durable's own tasks: a message is acknowledged after the work, redelivered if the worker dies.
_RELIABLE = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


class AttemptFailed(Exception):  # noqa: N818 - named for what it reports, not an error of its own
    """How a remote step's failed attempt leaves the task: its error as durable stores it."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error)  # the one argument, so Celery can pickle it to the errback
        self.durable_error = error

    def __str__(self) -> str:
        return str(self.durable_error.get("message"))


def remote_steps() -> list[Step]:
    """The steps this process knows that are remote: declared so, or on a REMOTE_QUEUES queue."""
    queues = set(conf.get().REMOTE_QUEUES)
    return [
        step for step in registry.steps.values() if step.remote or (step.queue in queues and not step.local)
    ]


def serve(app: Any) -> list[str]:
    """Register each remote step as a Celery task of ``app`` (those it has not already); return
    the names registered."""
    added = []
    for step in remote_steps():
        if step.name not in app.tasks:
            app.task(name=step.name, bind=True, **_RELIABLE)(_runner(step))
            added.append(step.name)
    return added


def _runner(step: Step) -> Any:
    def run(task: Any, *args: Any, **kwargs: Any) -> Any:
        where = dispatch.attempt_of(task.request)
        if where is None:
            raise AttemptFailed(
                {
                    "message": f"{step.name} is a remote step: durable sends it, with a durable_attempt header",
                    "type": "InvalidInput",
                    "code": "invalid_input",
                    "details": None,
                    "non_retryable": True,
                }
            )
        info = StepInfo(where["run_id"], where["seq"], where["attempt"], step.name, secret=where.get("token"))
        output, error, retryable = run_attempt(
            step,
            info,
            {"args": list(args), "kwargs": kwargs},
            lambda progress: dispatch.heartbeat_from(where, progress),
            timed_out=dispatch.SOFT_TIME_LIMIT_ERRORS,
        )
        if error is not None:
            raise AttemptFailed({**error, "non_retryable": not retryable})
        return output

    run.__name__ = step.fn.__name__
    run.__doc__ = f"Run remote step {step.name} from its message (see durable.remote)."
    return run
