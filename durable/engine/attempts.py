"""Execute one step attempt in this process: the step scope, its heartbeats, and whether a
dispatched step may run here, inside the turn that reached it, instead of crossing the broker.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from .. import clock, conf, dispatch
from ..definitions import Step
from ..errors import StepCancelled
from ..models import Checkpoint, Run
from ..replay.attempt import Result, beat_grace, run_attempt
from ..replay.history import Record, check_size, roundtrip
from ..replay.stepscope import StepInfo
from . import leases

log = logging.getLogger("durable.engine")


def serves(queue: str) -> bool:
    """Whether this process consumes ``queue`` (the harness consumes every queue)."""
    return dispatch.transport.serves(queue)


class InPlace:
    """Runs a dispatched step inside the turn that reached it, under the turn's lease.

    Offered only on a worker that consumes the step's queue (never under the test harness, whose
    messages stay visible), when EAGER_STEPS is on and no Celery time limit would cut the turn.
    """

    def __init__(self, run_id: str, settings: conf.Settings) -> None:
        self.run_id = run_id
        self.settings = settings

    @classmethod
    def offered(cls, run_id: str, settings: conf.Settings) -> InPlace | None:
        if (
            not settings.EAGER_STEPS
            or not dispatch.transport.served_queues
            or dispatch.time_limit() is not None
        ):
            return None
        return cls(run_id, settings)

    def accepts(self, queue: str) -> bool:
        return queue in (dispatch.transport.served_queues or ())

    def __call__(self, rec: Record, step: Step) -> Result:
        beats = Beats(self.run_id, rec.seq, rec.attempt, self.settings, step.heartbeat_timeout)
        with leases.unwatched(self.run_id):
            info = StepInfo(self.run_id, rec.seq, rec.attempt, step.name, secret=rec.token)
            result = execute(step, info, rec.input, beats)
        beats.keep_last(Checkpoint.objects.using(self.settings.DATABASE))
        return result


def execute(step: Step, info: StepInfo, payload: Any, beats: Beats) -> Result:
    """Run the attempt's body in this process; a Celery soft time limit is its timeout."""
    return run_attempt(
        step,
        info,
        payload,
        beats,
        timed_out=dispatch.SOFT_TIME_LIMIT_ERRORS,
        max_bytes=conf.get().MAX_PAYLOAD_BYTES,
    )


#: How often a heartbeating step asks whether its run was cancelled with interrupt=True.
CANCEL_CHECK = timedelta(seconds=1)


class Beats:
    """``durable.heartbeat()`` for a dispatched step: persist at most once per throttle window
    (for a step with a ``heartbeat_timeout``, at most once per ``beat_grace``, so the judge of its
    liveness never waits out the throttle), and raise ``StepCancelled`` once its run is cancelled
    with ``interrupt=True`` (asked at most once per CANCEL_CHECK)."""

    def __init__(
        self,
        run_id: str,
        seq: int,
        attempt: int,
        settings: conf.Settings,
        heartbeat_timeout: timedelta | None = None,
    ) -> None:
        self.key = (run_id, seq, attempt)
        self.db = settings.DATABASE
        self.max_bytes = settings.MAX_PAYLOAD_BYTES
        self.throttle = settings.HEARTBEAT_PERSIST_THROTTLE
        if heartbeat_timeout is not None:
            self.throttle = beat_grace(heartbeat_timeout, self.throttle)
        self.last: datetime | None = None
        self.last_had_progress = False
        self.unsaved: tuple[Any] | None = None
        self.checked: datetime | None = None

    def __call__(self, progress: Any = None) -> None:
        if progress is not None:
            progress = roundtrip(progress, what="heartbeat progress")
            check_size(progress, self.max_bytes, what="heartbeat progress")
        now = clock.now()
        due = (
            self.last is None
            or now - self.last >= self.throttle
            or (progress is not None and not self.last_had_progress)
        )
        if due:
            Checkpoint.objects.using(self.db).beat(*self.key, now, progress, progress is not None)
            self.last, self.last_had_progress = now, progress is not None
            self.unsaved = None
        elif progress is not None:
            self.unsaved = (progress,)
        self._check_cancel(now)

    def _check_cancel(self, now: datetime) -> None:
        if self.checked is not None and now - self.checked < CANCEL_CHECK:
            return
        self.checked = now
        run_id, seq, attempt = self.key
        if Run.objects.using(self.db).interrupted(run_id, seq):
            raise StepCancelled(
                f"run {run_id} was cancelled with interrupt=True: step attempt {seq}#{attempt} stops here"
            )

    def keep_last(self, checkpoints: Any) -> None:
        """Persist the newest progress a throttled beat skipped, so it outlives the step."""
        if self.unsaved is not None:
            run_id, seq, _ = self.key
            checkpoints.filter(run_id=run_id, seq=seq).update(progress=self.unsaved[0])
