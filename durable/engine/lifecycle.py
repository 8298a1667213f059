"""What happens when a run finishes: its parent is woken, and a dead run is dead-lettered.

Called inside the transaction that made the run terminal, so a crash cannot separate the two.
A cancel from outside ends a run here too.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from .. import clock, conf, dispatch
from ..definitions import Workflow, registry
from ..errors import DurableError, cancelled_error
from ..guards import DLQ_PREFIX, ON_ERROR_PREFIX
from ..inputs import DeadLetter, Failure
from ..models import TERMINAL, UNFINISHED, Checkpoint, Fan, Run, Status
from ..replay.composition import ABANDON, INTERRUPT
from ..replay.turnstate import TurnState
from ..statuses import CheckpointStatus
from ..values import decode
from . import flow, observe
from .runs import get_run, hand_over


def finished(run: Run, *, may_hold_slots: bool = True, may_have_children: bool = True) -> None:
    """Tell the world a run reached a terminal state (call inside that transaction).

    ``may_hold_slots=False``: the caller knows no attempt of the run can hold a step's limit
    slot (no pending limited step), which saves asking; ``may_have_children=False``: its history
    started no child, which saves asking for its unfinished children."""
    observe.run_ended(run)
    if run.singleton_key:
        from . import singletons

        singletons.admit(run.singleton_key, run.workflow)
    if may_hold_slots:
        flow.freed_by_run(run.id)
    if run.parent_id:
        _tell_parent(run)
    if run.status == Status.DEAD:
        dead_letter(run)
    elif run.status == Status.FAILED:
        route_failure(run)
    if may_have_children:
        _close_children(run)


def started_children(state: TurnState) -> bool:
    """Whether a run's history may have started a child (asked in memory when the turn holds the
    whole history, so most runs end without a query)."""
    return not state.whole_history or any(rec.kind == "child" for rec in state.records.values())


def cancel(
    run_id: str, error: dict[str, Any], *, compensate: bool, reason: str | None, interrupt: bool = False
) -> bool:
    """Cancel an unfinished run with ``error`` (RunNotFound if there is none); False if it had
    already finished. With ``compensate`` or ``interrupt``, the cancel is a durable request
    instead: the run's next turn unwinds its saga, or raises ``Cancelled`` in its body, then
    ends it cancelled. A run asked once keeps its first request."""
    settings = conf.get()
    with transaction.atomic(using=settings.DATABASE):
        run = get_run(run_id)
        if not compensate and not interrupt:
            return cancel_tree(run_id, error)
        request: dict[str, Any] = {"reason": reason}
        if interrupt:
            request.update(interrupt=True, compensate=compensate)
        if not Run.objects.using(settings.DATABASE).request_cancel(run_id, request, clock.now()):
            return run.status not in TERMINAL
        dispatch.advance(run_id, run.queue)
        return True


def cancel_tree(run_id: str, error: dict[str, Any]) -> bool:
    """Cancel an unfinished run, and through ``finished`` its unfinished children; False if done."""
    runs = Run.objects.using(conf.get().DATABASE)
    if not runs.end(run_id, Status.CANCELLED, error, clock.now()):
        return False
    finished(runs.get(id=run_id))
    return True


def _close_children(run: Run) -> None:
    """A run that ended, however it ended, leaves no unfinished child it did not let go: each is
    cancelled (depth first, the reason naming the ancestor), cancelled with ``interrupt=True``
    (its body gets ``Cancelled`` at its wait and may clean up), or abandoned, as it was started
    (``ctx.child(on_parent_close=...)``)."""
    runs = Run.objects.using(conf.get().DATABASE)
    children = runs.filter(parent_id=run.id, status__in=UNFINISHED).exclude(on_parent_close=ABANDON)
    if run.status == Status.CANCELLED:
        error = dict(run.error or cancelled_error())
        error["message"] = f"{error.get('message')} (its parent {run.id} was cancelled)"
    else:
        error = cancelled_error(f"its parent {run.id} ended {run.status}")
    for child_id, policy in children.values_list("id", "on_parent_close"):
        if policy == INTERRUPT:
            cancel(child_id, error, compensate=False, reason=error["message"], interrupt=True)
        else:
            cancel_tree(child_id, error)


def _tell_parent(run: Run) -> None:
    """Settle the parent's position that waits for this run, and wake the parent when it should."""
    settings = conf.get()
    db = settings.DATABASE
    now = clock.now()
    if run.parent_seq is None:
        return
    if run.status == Status.COMPLETED:
        status, output, error = CheckpointStatus.COMPLETED, run.output, None
    else:
        error = dict(
            run.error or {"message": run.status, "type": run.status, "code": run.status, "details": None}
        )
        error.setdefault("details", None)
        status, output = CheckpointStatus.FAILED, None
    checkpoints = Checkpoint.objects.using(db)
    if not checkpoints.settle_child(run.parent_id, run.parent_seq, status, output, error, now):
        return  # nobody waits for it (start_child), or it was settled already
    position = checkpoints.filter(run_id=run.parent_id, seq=run.parent_seq).values("fan", "fail_fast").first()
    parent_id = run.parent_id
    fan = position["fan"] if position is not None else None
    # Before the parent's row is locked by the wake: the order every writer keeps.
    left = Fan.objects.using(db).leave(parent_id, fan, run.parent_seq) if fan is not None else None
    if fan is None or (status == CheckpointStatus.FAILED and position and position["fail_fast"]):
        wake(parent_id)
        return

    def join() -> None:
        # Asked after this child's end committed, so the last member always sees the fan closed.
        if Checkpoint.objects.using(db).fan_closed(parent_id, fan, left):
            wake(parent_id)

    transaction.on_commit(join, using=db)


def wake(run_id: str) -> None:
    """Wake an unfinished run and send it a turn."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE)
    queue = runs.wake(run_id, clock.now(), clock.now() + settings.LEASE)
    if queue is not None:
        dispatch.advance(run_id, queue)


def dead_letter(run: Run) -> None:
    """Start the dead-letter workflow for ``run`` as ``dlq:<run id>``, once."""
    if run.id.startswith(DLQ_PREFIX):
        return  # a dead-letter handler that dies is not routed again
    definition = _definition(run)
    handler = (definition.dead_letter if definition else None) or conf.get().DEAD_LETTER_WORKFLOW
    # The input as the run received it: starting the handler tags it again.
    letter = DeadLetter(dead_run_id=run.id, workflow=run.workflow, input=decode(run.input), error=run.error)
    hand_over(run, handler, letter.to_dict(), f"{DLQ_PREFIX}{run.id}")


def route_failure(run: Run) -> None:
    """Start the ``on_error`` handler whose code matches the run's error (else ``"*"``), once."""
    definition = _definition(run)
    routes = (definition.on_error if definition else None) or {}
    code = (run.error or {}).get("code")
    handler = routes.get(code) if code in routes else routes.get("*")
    failure = Failure(run_id=run.id, workflow=run.workflow, input=decode(run.input), error=run.error)
    hand_over(run, handler, failure.to_dict(), f"{ON_ERROR_PREFIX}{run.id}")


def _definition(run: Run) -> Workflow | None:
    try:
        return registry.workflow(run.workflow, run.version)
    except DurableError:
        return None


def resend_unsent(run_id: str) -> None:
    """A message for this run came again after the process handling it died: that process may
    have committed sends it never published. Send the run's unstarted attempts again (new
    tokens) through a turn, now rather than after STEP_REDISPATCH_AFTER."""
    settings = conf.get()
    db = settings.DATABASE
    now = clock.now()
    with transaction.atomic(using=db):
        Checkpoint.objects.using(db).unsend([run_id])
        queue = Run.objects.using(db).wake(run_id, now, now + settings.LEASE)
    if queue:
        dispatch.advance(run_id, queue)
