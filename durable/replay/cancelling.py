"""A cancel delivered into the body (``durable.cancel(run_id, interrupt=True)``), for the replay
context: ``durable.Cancelled`` raised at the body's current wait, recorded so replays repeat it.

Pure like the rest of the replay core: no ORM, no Celery.
"""

from __future__ import annotations

from typing import Any

from ..errors import Cancelled, DurableError, ErrorCode, GatherError, StepFailed, cancelled_error
from ..statuses import Decided
from .history import COMPLETED, Decision
from .positions import Pending, Positions

#: The kind (and name) of the position that records where a cancel was delivered.
CANCEL = "cancel"


class Cancelling(Positions):
    """Delivers an interrupting cancel once: at the wait the run was suspended on when the cancel
    came (what it waited for may have ended since: the body still gets ``Cancelled`` there, and
    cleanup in its ``finally`` runs as it would had the cancel come first), else at the first
    primitive that would wait.

    Where it was delivered is a position of its own, right after the wait's: a later turn that
    replays the same wait raises ``Cancelled`` there again, whatever became of the wait since
    (a step that ended, a timer that fired), so the body takes the same path on every replay.
    """

    #: The run's interrupting cancel request (``{"reason": ..., "interrupt": True}``), or None.
    _interrupt: dict[str, Any] | None
    #: Whether the history already holds the delivery (it happens once per run).
    _delivered: bool
    #: The last position of the history as this turn began: the wait the last turn stopped at.
    _frontier: int | None

    def _init_cancelling(self, request: dict[str, Any] | None) -> None:
        self._interrupt = request if request is not None and request.get("interrupt") else None
        self._delivered = any(rec.kind == CANCEL for rec in self._turn.records.values())
        self._frontier = max(self._turn.records, default=None)

    def _deliver_cancel(self, answer: Any) -> None:
        """Raise ``Cancelled`` after the primitive that gave ``answer``, if the cancel is delivered
        here: recorded here by an earlier turn, or due now because the primitive would wait (or
        what it waited for was stopped by this cancel first: a step that saw StepCancelled)."""
        recorded = self._turn.records.get(self._next)
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
            or self._here == self._frontier
        )
        if not waiting or request is None or self._delivered or recorded is not None:
            return
        self._position(CANCEL, CANCEL)
        reason = request.get("reason")
        rec = self._new(CANCEL, CANCEL, status=COMPLETED, input={"reason": reason})
        rec.finished_at = self._now()
        self._delivered = True
        raise Cancelled(reason or "cancelled")


def _step_cancelled(answer: Any) -> bool:
    """Whether ``answer`` is the failure of a step (or of a fan's steps) stopped by StepCancelled."""
    if isinstance(answer, GatherError):
        return any(_step_cancelled(error) for error in answer.errors)
    return isinstance(answer, StepFailed) and (answer.cause or {}).get("type") == "StepCancelled"


def cancelled(ctx: Cancelling, escaped: BaseException | None) -> Decision | None:
    """The decision for a body that let ``Cancelled`` escape: the run ends cancelled (None if the
    body ended otherwise). The reason is the request's, else the exception's own message."""
    if not isinstance(escaped, Cancelled):
        return None
    reason = (ctx._interrupt or {}).get("reason") or (escaped.message if ctx._interrupt is None else None)
    return Decision(Decided.CANCELLED, error=cancelled_error(reason))


def compensates(ctx: Cancelling) -> bool:
    """Whether the interrupting cancel also asked for the saga to be unwound."""
    return bool((ctx._interrupt or {}).get("compensate"))
