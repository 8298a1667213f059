"""The replay context handed to workflow bodies; ``core.replay()`` makes one for each turn.

Each primitive answers from the record at its position when there is one, otherwise decides what
to do and records it. It imports neither the ORM nor Celery: the turn executor supplies the history
and persists the result.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

from .. import asyncsteps
from ..annotated import shaped, signature
from ..definitions import Step, celery_task_step, plain_task_refused, registry
from ..errors import (
    Cancelled,
    DurableError,
    ErrorCode,
    GatherError,
    InvalidInput,
    NonDeterminismError,
    StepFailed,
    Suspend,
    WorkerLost,
    non_determinism_message,
    step_timeout_error,
)
from ..statuses import FlowState
from ..values import decode
from .attempt import LATER, beat_grace, run_attempt, split_traceback
from .composition import Composition
from .entity_calls import Entities
from .history import COMPLETED, FAILED, PENDING, Limits, Record
from .messages import Messages
from .patches import PATCH, Patches
from .positions import Pending, Positions
from .queries import Queries
from .quiet import QuietWhileReplaying
from .searchattributes import SearchAttributes
from .stepscope import StepInfo
from .stopping import Stopping
from .streams import Streams
from .timers import Timers
from .turnstate import InPlaceRunner, LocalLimits, RunFacts, TurnState
from .updates import Updates
from .waits import Waits

log = logging.getLogger("durable.workflow")

#: The kind (and name) of the position that records where an interrupting cancel was delivered.
CANCEL = "cancel"


class Context(
    Composition,
    Updates,
    Waits,
    Queries,
    Streams,
    Messages,
    SearchAttributes,
    Patches,
    Entities,
    Timers,
    Stopping,
    Positions,
):
    """What a workflow body receives; every call is recorded once and replayed after."""

    def __init__(
        self,
        run: RunFacts,
        state: TurnState,
        *,
        clock: Callable[[], datetime],
        limits: Limits,
        flush: Callable[[TurnState], None],
        renew: Callable[[], None],
        in_place: InPlaceRunner | None = None,
        local_limits: LocalLimits | None = None,
        stopped: Callable[[], BaseException | None] | None = None,
        ahead: bool = False,
    ) -> None:
        self._facts = run
        self._in_place = in_place
        self._local_limits = local_limits
        self._turn = state
        self._clock = clock
        self._limits = limits
        self._init_stopping(stopped, ahead=ahead)
        self._flush = self._sticky(flush)
        self._renew = self._sticky(renew)
        self._seq = 0
        self._at = 0  # the position of the primitive being answered
        self._held = False  # a result of an attempt run in place waits for the next write
        self._replay_until = max(state.records, default=-1)
        self._nondeterminism: NonDeterminismError | None = None
        request = run.cancel_request
        #: The run's interrupting cancel request (``{"reason": ..., "interrupt": True}``), or None.
        self._interrupt = request if request is not None and request.get("interrupt") else None
        #: Whether the history already holds the cancel's delivery (it happens once per run).
        self._delivered = any(rec.kind == CANCEL for rec in state.records.values())
        #: The last position of the history as this turn began: the wait the last turn stopped at.
        self._frontier = max(state.records, default=None)
        self.logger = QuietWhileReplaying(log, self)

    # -- facts -----------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self._facts.id

    @property
    def workflow_name(self) -> str:
        return self._facts.workflow

    @property
    def version(self) -> str:
        return self._facts.version

    @property
    def namespace(self) -> str | None:
        return self._facts.namespace

    @property
    def is_replaying(self) -> bool:
        """True while the body is re-walking positions recorded by earlier turns."""
        return self._seq <= self._replay_until

    # -- the interface of the mixed-in primitives (see ``positions.Positions``) --------------

    def _now(self) -> datetime:
        return self._clock()

    @property
    def _here(self) -> int:
        return self._at

    @property
    def _next(self) -> int:
        return self._seq

    # -- primitives ------------------------------------------------------------------------

    def step(self, step: Step | str, *args: Any, **kwargs: Any) -> Any:
        """Run ``step`` (at least once per attempt) and return its recorded output."""
        definition = self._step_definition(step)
        here = self._runs_here(definition)
        rec = self._step_position(definition, args, kwargs, fan=None, fail_fast=False, send=not here)
        return shaped(self._settle(self._resolve_step(rec, definition)), signature(definition.fn).returns)

    def _step_position(
        self,
        step: Step,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        fan: int | None,
        fail_fast: bool,
        send: bool = True,
    ) -> Record:
        rec = self._position("step", step.name)
        if rec is None:
            if step.celery_task and self._limits.sealed_payloads:
                raise plain_task_refused(step.name)
            payload = self._storable(
                {"args": list(args), "kwargs": kwargs}, f"the arguments of step {step.name!r}"
            )
            if step.celery_task:
                payload["task"] = True  # sent as the task itself, routed by Celery unless it names a queue
            elif self._is_remote(step):
                payload["remote"] = True  # sent under its name; its result comes back as a message
            rec = self._new(
                "step",
                step.name,
                input=payload,
                queue=self._queue_of(step),
            )
            rec.fan, rec.fail_fast = fan, fail_fast
            if not step.local and send:
                self._send(rec, step)
        return rec

    # -- positions -------------------------------------------------------------------------

    def _position(self, kind: str, name: str) -> Record | None:
        """Return the record at the next position, checking it is what the body asks for."""
        self._guard()
        stop = self._stopped() if self._stopped is not None else None
        if stop is not None:
            raise self._stop(stop)
        seq = self._seq
        rec = self._turn.records.get(seq)
        # A patch marker left by a patched() call since deleted (see ``patches``) is stepped over.
        while rec is not None and rec.kind == PATCH and (kind, name) != (PATCH, rec.name):
            seq += 1
            rec = self._turn.records.get(seq)
        self._take(seq)
        if rec is not None and (rec.kind != kind or rec.name != name):
            error = NonDeterminismError(
                non_determinism_message(seq, (rec.kind, rec.name), (kind, name)),
                details={"seq": seq, "recorded": [rec.kind, rec.name], "requested": [kind, name]},
            )
            self._nondeterminism = error
            raise self._stop(error)
        return rec

    def _take(self, seq: int) -> None:
        self._at = seq
        self._seq = seq + 1

    def _new(self, kind: str, name: str, *, status: str = PENDING, **fields: Any) -> Record:
        self._guard()
        rec = Record(seq=self._at, kind=kind, name=name, status=status, **fields)
        self._turn.records[rec.seq] = rec
        return rec

    def _settle(self, answer: Any) -> Any:
        self._deliver_cancel(answer)
        if isinstance(answer, Pending):
            if answer.wake_at is not None:
                self._turn.wakes.append(answer.wake_at)
                if answer.timer:
                    self._turn.timers.append(answer.wake_at)
            raise self._stop(Suspend())
        if isinstance(answer, BaseException):
            raise answer
        # Every answer a body receives is read from the history as stored (tagged JSON), on the
        # first turn as on a replay: the body sees the same typed value both times.
        return decode(answer)

    def _deliver_cancel(self, answer: Any) -> None:
        """Raise ``Cancelled`` after the primitive that gave ``answer`` if an interrupting cancel
        (``durable.cancel(run_id, interrupt=True)``) is delivered here: recorded here by an earlier
        turn, or due now. It is due at the wait the run was suspended on when the cancel came
        (what it waited for may have ended since: the body still gets ``Cancelled`` there, and
        cleanup in its ``finally`` runs as it would had the cancel come first), else at the first
        primitive that would wait (or whose step saw StepCancelled, stopped by this cancel).

        Where it was delivered is a position of its own, right after the wait's: a later turn that
        replays the same wait raises ``Cancelled`` there again, whatever became of the wait since
        (a step that ended, a timer that fired), so the body takes the same path on every replay."""
        recorded = self._turn.records.get(self._seq)
        if recorded is not None and recorded.kind == CANCEL:
            self._position(CANCEL, CANCEL)
            raise Cancelled((recorded.input or {}).get("reason") or "cancelled")
        request = self._interrupt
        if request is None and _step_cancelled(answer):
            # A step run in place saw a cancel requested after this turn read the run: deliver it
            # here, where the turn that reads the request will (this one cannot settle: the
            # request woke the run), so what this turn flushes meanwhile replays the same.
            request = {"interrupt": True, "reason": None}
        waiting = (
            isinstance(answer, Pending)
            or (isinstance(answer, DurableError) and answer.code == ErrorCode.CANCELLED)
            or self._at == self._frontier
        )
        if not waiting or request is None or self._delivered or recorded is not None:
            return
        self._position(CANCEL, CANCEL)
        reason = request.get("reason")
        rec = self._new(CANCEL, CANCEL, status=COMPLETED, input={"reason": reason})
        rec.finished_at = self._clock()
        self._delivered = True
        raise Cancelled(reason or "cancelled")

    # -- steps -----------------------------------------------------------------------------

    def _step_definition(self, step: Any) -> Step:
        """The step ``ctx.step`` was given (a definition, a name or a Celery task)."""
        if isinstance(step, Step):
            return step
        if isinstance(step, str):
            return registry.steps.get(step) or celery_task_step(step)
        if hasattr(step, "apply_async"):
            return celery_task_step(step)
        raise InvalidInput(f"ctx.step() takes a @durable.step, a Celery task or a task name, got {step!r}")

    def _definition_of(self, rec: Record) -> Step:
        """The step behind a recorded position (a Celery task's is rebuilt from its name)."""
        if (rec.input or {}).get("task"):
            return celery_task_step(rec.name)
        return registry.step(rec.name)

    def _resolve_step(self, rec: Record, step: Step) -> Any:
        now = self._clock()
        if rec.status == COMPLETED:
            return rec.output
        if rec.status == FAILED:
            return self._failure(StepFailed(cause=rec.error), rec)
        if step.local:
            if rec.wake_at is not None and rec.wake_at > now:
                return Pending(rec.wake_at)
            return self._run_local(rec, step)
        if rec.enqueued_at is None and rec.started_at is not None:
            # Started in place by a turn that has since lost the lease: its process is gone.
            return self._attempt_lost(rec, step, "the turn running it in place died or lost its lease")
        if rec.enqueued_at is None and rec.fan is None and self._runs_here(step):
            # New, or past its backoff.
            if rec.wake_at is not None and rec.wake_at > now:
                return Pending(rec.wake_at)
            return self._run_in_place(rec, step)
        if rec.enqueued_at is None:
            # Waiting out a retry backoff, or its message was found lost (``redispatches``).
            if rec.wake_at is not None and rec.wake_at > now:
                return Pending(rec.wake_at)
            if rec.redispatches > self._limits.redispatch_limit:
                return self._never_taken(rec, step)
            self._send(rec, step)
            return self._resolve_step(rec, step)  # sent: look again by its timeout, too
        if rec.started_at is None and rec.flow == FlowState.WAITING:
            # In line for a slot of its concurrency limit: the attempt that frees one sends it.
            return Pending(None)
        if rec.started_at is None and rec.flow == FlowState.RATE:
            # Over its rate limit: sent again once its token falls due.
            if rec.wake_at is not None and rec.wake_at > now:
                return Pending(rec.wake_at)
            self._send(rec, step)
        seen = self._seen(now)
        if rec.started_at is None:
            if seen >= rec.enqueued_at + self._limits.redispatch_after:
                # The message was lost, or no worker took it.
                rec.redispatches += 1
                if rec.redispatches > self._limits.redispatch_limit:
                    return self._never_taken(rec, step)
                self._send(rec, step)
            # Look again by the earliest moment a started attempt could have overrun.
            earliest = self._deadline(rec, step, since=rec.enqueued_at)
            return Pending(
                min(filter(None, [rec.enqueued_at + self._limits.redispatch_after, earliest])), timer=False
            )
        if rec.held_until is not None and rec.held_until <= seen:
            return self._attempt_lost(
                rec,
                step,
                "its worker process stopped renewing it (killed, out of "
                "memory, or its result could not be recorded)",
            )
        deadline = self._deadline(rec, step, since=rec.started_at)
        if deadline is not None and seen >= deadline:
            err = step_timeout_error(
                f"step {step.name!r} attempt {rec.attempt} gave no result or heartbeat in time"
            )
            self._attempt_failed(rec, step, err, retryable=True)
            return self._resolve_step(rec, step)
        return Pending(deadline, timer=False)

    def _attempt_lost(self, rec: Record, step: Step, why: str) -> Any:
        """Count an attempt whose executor died as a failed one; the retry policy decides the rest."""
        lost = WorkerLost(
            f"step {step.name!r} attempt {rec.attempt} ended without a result: {why}",
            details={"attempt": rec.attempt},
        )
        self._attempt_failed(rec, step, lost.to_dict(), retryable=step.retry.is_retryable(lost))
        return self._resolve_step(rec, step)

    def _never_taken(self, rec: Record, step: Step) -> Any:
        """Fail an attempt sent again STEP_REDISPATCH_LIMIT times that no worker ever took."""
        queue, limit = rec.queue or self._limits.default_queue, self._limits.redispatch_limit
        error = {
            "message": (
                f"step {step.name!r} attempt {rec.attempt} was sent again {limit} times and no "
                f"worker of queue {queue!r} took it: start a worker that consumes {queue!r} "
                "(celery worker -Q ...), or raise STEP_REDISPATCH_LIMIT"
            ),
            "type": "NotTaken",
            "code": ErrorCode.REDISPATCH_LIMIT,
            "details": {"queue": queue, "redispatches": limit},
        }
        self._attempt_failed(rec, step, error, retryable=False)
        return self._resolve_step(rec, step)

    def _seen(self, now: datetime) -> datetime:
        """The time at which the records tell of attempts running elsewhere: ``now``, or the
        read, when that was earlier (beats, holds and takes since then are not in them)."""
        read_at = self._turn.read_at
        return now if read_at is None else min(now, read_at)

    def _deadline(self, rec: Record, step: Step, *, since: datetime) -> datetime | None:
        """When an attempt that started at ``since`` has overrun its timeout or gone silent."""
        limits = []
        if step.timeout is not None:
            limits.append(since + step.timeout + self._limits.timeout_grace)
        if step.heartbeat_timeout is not None:
            last = max(filter(None, [since, rec.last_heartbeat_at]))
            # The executor persists beats of such a step at least this often (see beat_grace).
            grace = beat_grace(step.heartbeat_timeout, self._limits.heartbeat_throttle)
            limits.append(last + step.heartbeat_timeout + grace)
        return min(limits, default=None)

    def _send(self, rec: Record, step: Step) -> None:
        now = self._clock()
        # A new secret per send: only the message sent last may start or settle the attempt.
        rec.token = secrets.token_urlsafe(24)
        # Started by this process once the turn commits, if it may: taken in the turn's own
        # write, as a worker's take would (a process that dies before its result lets the hold
        # lapse, and the attempt counts as lost).
        rec.held_by = self._holder(rec, step)
        rec.held_until = now + self._limits.lease if rec.held_by else None
        rec.enqueued_at = now
        rec.started_at = now if rec.held_by else None
        rec.last_heartbeat_at = None
        rec.wake_at = now + self._limits.redispatch_after
        if rec.flow != FlowState.HELD:
            rec.flow = None  # a slot handed to it is kept: its message was lost, not its place
        rec.changed()
        self._turn.dispatch.append(rec)

    def _attempt_failed(self, rec: Record, step: Step, error: dict[str, Any], *, retryable: bool) -> None:
        """Record a failed attempt: schedule the next one, or fail the step for good."""
        now = self._clock()
        error, trace = split_traceback(error)
        rec.failures.append({"attempt": rec.attempt, "error": error, "traceback": trace, "at": now})
        rec.error = error
        rec.enqueued_at = rec.started_at = rec.last_heartbeat_at = rec.held_until = rec.held_by = None
        rec.token = None
        rec.redispatches = 0
        if rec.flow == FlowState.HELD and rec.flow_key:
            self._turn.freed.append(rec.flow_key)
        rec.flow = None
        if retryable and step.retry.allows_after(rec.attempt):
            rec.wake_at = now + step.retry.delay(rec.attempt)
            rec.attempt += 1
        else:
            rec.status = FAILED
            rec.wake_at = None
            rec.finished_at = now
        rec.changed()

    def _is_remote(self, step: Step) -> bool:
        """Whether ``step`` runs on a worker that may have no database (declared, or by its queue)."""
        if step.remote:
            return True
        queue = step.queue or self._limits.default_queue
        remote = self._limits.remote_queues
        return not step.local and (queue in remote or self._queue_of(step) in remote)

    def _runs_here(self, step: Step) -> bool:
        """Whether a dispatched step awaited on its own may run inside this turn (its time limits
        are enforced wherever it runs; a Celery task keeps Celery's, on a worker of its queue)."""
        return (
            self._in_place is not None
            and not step.local
            and not step.celery_task
            and not self._is_remote(step)
            and self._in_place.accepts(self._queue_of(step), step)
        )

    def _holder(self, rec: Record, step: Step) -> str | None:
        """Who starts the attempt without a message, as ``_runs_here`` but beside the turn."""
        if self._in_place is None or rec.fan is not None or step.local or step.celery_task or step.limited:
            return None
        if self._is_remote(step):
            return None
        return self._in_place.holder(self._queue_of(step), step)

    def _run_local(self, rec: Record, step: Step) -> Any:
        self._before_local_step()
        if (step.timeout is not None or step.heartbeat_timeout is not None) and not asyncsteps.is_async(
            step.fn
        ):
            return self._run_local_limited(rec, step)
        if self._held:
            # A local step may run long: the result held back is written before it starts.
            self._flush(self._turn)
            self._held = False
        info = StepInfo(self._facts.id, rec.seq, rec.attempt, step.name)
        rec.started_at = self._clock()
        # A local step's beat proves the turn alive: it renews the turn's lease.
        return self._attempt_ended(
            rec,
            step,
            *run_attempt(
                step,
                info,
                rec.input,
                lambda progress: self._renew(),
                max_bytes=self._limits.max_payload_bytes,
            ),
        )

    def _run_local_limited(self, rec: Record, step: Step) -> Any:
        """A local step with time limits, run by the executor under them. It is written as started
        first, as an attempt run in place is, so the watchdog can record it at the hard limit;
        a turn that dies in it leaves it pending, and the next turn runs that attempt again."""
        if self._local_limits is None:
            raise InvalidInput(
                f"step {step.name!r} is local=True with a time limit, which this turn cannot enforce "
                "(a remote turn runs no watchdog): make it a dispatched step (local=False) or drop the limit"
            )
        rec.started_at = self._clock()
        rec.changed()
        self._flush(self._turn)
        self._held = False  # written with this attempt's start
        return self._attempt_ended(rec, step, *self._local_limits(rec, step))

    def _run_in_place(self, rec: Record, step: Step) -> Any:
        """Run a dispatched step here, under the turn's lease. It is written as started (never
        enqueued) before it runs: a later turn that finds it so, still pending, knows its
        executor died with the turn that held the lease, and counts the attempt as lost. A
        limited step takes its slot and rate token in that write, or waits instead."""
        assert self._in_place is not None
        rec.enqueued_at = rec.last_heartbeat_at = rec.wake_at = rec.held_until = rec.held_by = None
        rec.token = secrets.token_urlsafe(24)  # written before the step runs: it may complete later
        rec.started_at = self._clock()
        rec.changed()
        self._flush(self._turn)
        self._held = False  # written with this attempt's start
        if rec.started_at is None:
            # A limited step: the write that started it found no free slot or rate token, and
            # made it one sent but unstarted that waits, as a worker's take would have.
            return self._resolve_step(rec, step)
        result = self._in_place(rec, step)
        return self._attempt_ended(rec, step, *result, hold=True)

    def _attempt_ended(
        self,
        rec: Record,
        step: Step,
        output: Any,
        error: dict[str, Any] | None,
        retryable: bool,
        *,
        hold: bool = False,
    ) -> Any:
        """Record an attempt run inside this turn, then answer as the position now stands."""
        if output is LATER:
            # Open until complete_step() settles it: as if dispatched, so no later turn counts it
            # lost with the turn that ran it. The let-go is the body's last sign of life: a
            # heartbeat_timeout counts from it, so the other system has all of it to beat first.
            rec.enqueued_at = rec.started_at
            rec.last_heartbeat_at = self._clock()
            rec.changed()
            self._flush(self._turn)
            return self._resolve_step(rec, step)
        if error is not None:
            self._attempt_failed(rec, step, error, retryable=retryable)
            self._flush(self._turn)
            return self._resolve_step(rec, step)
        rec.status = COMPLETED
        rec.output = output
        rec.error = None
        rec.wake_at = None
        rec.finished_at = self._clock()
        if rec.flow == FlowState.HELD and rec.flow_key:
            self._turn.freed.append(rec.flow_key)  # handed on once the result is written
        rec.flow = None
        rec.changed()
        if hold:
            # An attempt run in place is written as started already: its result can wait for
            # the turn's next write (the next attempt's start, or the settle) and commit with it.
            # Lost with this process, it is an attempt that died running: retried, as one would be.
            self._held = True
        else:
            self._flush(self._turn)
        return output

    def _failure(self, exc: DurableError, rec: Record) -> DurableError:
        self._turn.raised.setdefault(id(exc), []).append(rec.seq)
        return exc


def _step_cancelled(answer: Any) -> bool:
    """Whether ``answer`` is the failure of a step (or of a fan's steps) stopped by StepCancelled."""
    if isinstance(answer, GatherError):
        return any(_step_cancelled(error) for error in answer.errors)
    return isinstance(answer, StepFailed) and (answer.cause or {}).get("type") == "StepCancelled"
