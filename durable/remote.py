"""Remote steps served by a Python worker that has durable installed but maybe no database.

Each remote step this process knows becomes a Celery task under the step's name: it runs the
step's body in a step scope whose heartbeats leave as ``durable.heartbeat`` messages. Its result
goes back the way any Celery task used as a step reports: the message's ``link`` on success, its
``link_error`` on failure (forwarded as a ``durable.step_result`` message, see
``engine.results_by_message.task_failed``). Nothing here touches the database.

With ``DURABLE["CODEC"]`` set, the payloads of the messages (step arguments, results, progress,
a turn's input, history and decision) travel sealed as the rows hold them: this process opens
and seals them with its own CODEC and CODEC_KEYS, which must be the fleet's.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import clock, codecs, conf, dispatch
from .definitions import Step, Workflow, registry
from .errors import ErrorCode, InvalidInput, PayloadUndecodable, WorkflowNotRegistered
from .replay import wire
from .replay.attempt import run_attempt
from .replay.core import replay
from .replay.history import Decision
from .replay.stepscope import StepInfo
from .statuses import Decided

log = logging.getLogger("durable.remote")

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
            # Not shared: the task belongs to ``app`` alone, not to every app made after it.
            app.task(name=step.name, bind=True, shared=False, **_RELIABLE)(_runner(step))
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
                    "code": ErrorCode.INVALID_INPUT,
                    "details": None,
                    "non_retryable": True,
                }
            )
        try:
            payload = arguments(args, kwargs)
        except PayloadUndecodable as exc:
            # This worker's CODEC_KEYS are not the fleet's: the step's policy retries it, maybe
            # on a worker that has them.
            raise AttemptFailed({**exc.to_dict(), "non_retryable": False}) from None
        info = StepInfo(where["run_id"], where["seq"], where["attempt"], step.name, secret=where.get("token"))
        output, error, retryable = run_attempt(
            step,
            info,
            payload,
            lambda progress: dispatch.heartbeat_from(where, progress),
            timed_out=dispatch.SOFT_TIME_LIMIT_ERRORS,
        )
        if error is not None:
            raise AttemptFailed({**error, "non_retryable": not retryable})
        return codecs.sealed(output, conf.codec())  # the link carries it to durable.step_result

    run.__name__ = step.fn.__name__
    run.__doc__ = f"Run remote step {step.name} from its message (see durable.remote)."
    return run


def arguments(args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A remote step's payload from its message's arguments, each opened when sealed;
    ``PayloadUndecodable`` when this process's codec cannot open one."""
    codec = conf.codec()
    return {
        "args": [codecs.opened(arg, codec) for arg in args],
        "kwargs": {name: codecs.opened(value, codec) for name, value in kwargs.items()},
    }


def run_turn(message: dict[str, Any]) -> str:
    """Replay one remote turn (``turn.json``) and send its ``durable.decision`` to ``reply_to``;
    say what it decided. Nothing here touches the database: the messages carry it all."""
    codec = conf.codec()
    try:
        facts = wire.facts_in(message, codec)
        state = wire.state_in(message, codec)
    except PayloadUndecodable as exc:
        # No decision: the lease lapses and the turn is sent again, maybe to a worker with the keys.
        log.error(
            "durable: turn of run %s dropped (%s): %s", (message.get("run") or {}).get("id"), exc.code, exc
        )
        return "undecodable"
    try:
        workflow = registry.workflow(facts.workflow, facts.version)
    except WorkflowNotRegistered:
        # A rolling deploy: no decision, so the lease lapses and a worker that has it replays.
        log.warning(
            "durable: %s@%s is not registered here; turn of run %s dropped",
            facts.workflow,
            facts.version,
            facts.id,
        )
        return "unknown"
    state.find_event = _not_in_remote_turn("ctx.wait_for_event()")
    state.find_run = _not_in_remote_turn("ctx.signal() and ctx.start()")
    beats = _TurnHeartbeats(message)
    beats.start()
    try:
        outcome = _replay(workflow, facts, state, message)
    finally:
        beats.stop()
    decision = wire.decision_message(message, state, outcome, codec)
    dispatch.decision(decision, message["reply_to"])
    return str(outcome.status)


def _replay(workflow: Workflow, facts: Any, state: Any, message: dict[str, Any]) -> Decision:
    if workflow.input_schema is not None:
        try:
            parsed = workflow.body_input(facts.input)
        except InvalidInput as exc:
            return Decision(Decided.FAILED, error=exc.to_dict())
        facts = type(facts)(**{**facts.__dict__, "input": parsed})
    # Positions are written by the worker that applies the decision: nothing to flush mid-turn,
    # and the turn's lease is kept by the heartbeat thread.
    return replay(
        workflow,
        facts,
        state,
        clock=clock.now,
        limits=wire.limits_in(message["limits"]),
        flush=lambda _state: None,
        renew=lambda: None,
    )


def _not_in_remote_turn(what: str) -> Any:
    def refuse(*_: Any) -> Any:
        raise InvalidInput(
            f"{what} needs the database, which a remote turn does not have; "
            "make the workflow a local one (remote=False) or move it into a child run"
        )

    return refuse


class _TurnHeartbeats:
    """Sends ``durable.turn_heartbeat`` every third of the lease while a remote turn replays."""

    def __init__(self, message: dict[str, Any]) -> None:
        self._message = message
        self._every = max(float(message.get("lease_seconds") or 30) / 3, 0.2)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="durable-turn-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _beat(self) -> None:
        while not self._done.wait(self._every):
            dispatch.turn_heartbeat(
                self._message["run"]["id"], self._message["turn"], self._message["reply_to"]
            )
