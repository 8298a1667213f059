"""Where a run's next turn runs once a step's result is recorded: here, claimed in the commit
that recorded it, or on a worker of the run's queue (a message)."""

from __future__ import annotations

import time

from .. import conf, dispatch
from ..models import Claim, Run
from . import attempts, turn


def claimed_unseen(run_id: str, claim: Claim) -> Run | None:
    """The run, if a try whose commit this process never saw recorded the result and claimed
    the turn (its connection cut after the COMMIT): the retry then finds the attempt settled."""
    return Run.objects.using(conf.get().DATABASE).filter(id=run_id, locked_by=claim.owner).first()


def claim(settings: conf.Settings, began: float | None) -> Claim | None:
    """The claim that lets recording a result take the run's next turn in the same commit,
    when that turn would run here: this worker serves the run's queue (checked by the claim) and
    no Celery time limit would cut the turn short."""
    served = dispatch.transport.served_queues
    if not settings.INLINE_NEXT_TURN or served == set() or not _time_for_a_turn(settings, began):
        return None
    return Claim(turn.new_owner(settings), settings.LEASE, None if served is None else frozenset(served))


def run_or_send(
    run_id: str, queue: str, settings: conf.Settings, began: float | None = None, *, inline: bool = True
) -> None:
    """Run the next turn here when this worker serves the run's queue, else send it there.

    A step's own timeout ends with the step (durable enforces it, see ``timelimits``); a Celery
    time limit the project set on the task goes on ticking: the turn runs here only with at least
    a LEASE of it left, the time a turn is given anyway."""
    if inline and settings.INLINE_NEXT_TURN and attempts.serves(queue) and _time_for_a_turn(settings, began):
        turn.advance(run_id)
    else:
        dispatch.advance(run_id, queue)


def _time_for_a_turn(settings: conf.Settings, began: float | None) -> bool:
    """Whether at least a LEASE is left of the Celery time limit of the task running now, if any."""
    limit = dispatch.time_limit()
    if limit is None:
        return True
    left = limit - (time.monotonic() - began) if began is not None else 0.0
    return left >= settings.LEASE.total_seconds()
