"""``replay()``: one turn of a run's body, from the top, and how the run stands after it.

The body sees only its ``Context`` and may catch what the primitives raise; the engine needs one
verdict on how the run stands, whatever the body did with them. That verdict is reached here, once,
for a turn, a remote turn and a turn replayed ahead alike. Pure like the rest of the replay core:
the turn executor supplies the history and persists the result.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from .. import shutdown
from ..definitions import Workflow, body_scope
from ..errors import Cancelled, ErrorCode, InvalidInput, cancelled_error, error_dict
from ..statuses import Decided
from ..values import stored
from . import asyncbody, asynccontext, saga, stopping
from .context import Context
from .history import Decision, Limits
from .turnstate import InPlaceRunner, LocalLimits, RunFacts, TurnState


def replay(
    workflow: Workflow,
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
) -> Decision:
    """Run the body from the top against ``state`` and say how the run stands.

    ``stopped`` is the engine's in-memory word that the turn must stop (see ``Context``): what it
    returns is raised at the next primitive and, whatever the body made of it, out of replay().
    ``ahead``: the turn runs before the run is held; NotAhead is raised out of replay() before a
    local step would run.
    """
    body_async = asyncbody.is_async(workflow.fn)
    ctx = (asyncbody.BodyContext if body_async else Context)(
        run,
        state,
        clock=clock,
        limits=limits,
        flush=flush,
        renew=renew,
        in_place=in_place,
        local_limits=local_limits,
        stopped=stopped,
        ahead=ahead,
    )
    if run.cancel_request is not None and not run.cancel_request.get("interrupt"):
        return saga.unwind(
            ctx, Decision(Decided.CANCELLED, error=cancelled_error(run.cancel_request.get("reason")))
        )
    if run.deadline is not None and clock() >= run.deadline:
        return Decision(
            Decided.FAILED,
            error={
                "message": f"the run passed its execution deadline ({run.deadline.isoformat()})",
                "type": "WorkflowTimeout",
                "code": ErrorCode.TIMEOUT,
                "details": {"deadline": run.deadline.isoformat()},
            },
        )
    escaped: BaseException | None = None
    try:
        with body_scope(run.workflow):
            value = (
                asynccontext.run(workflow.fn, ctx, run.input) if body_async else workflow.fn(ctx, run.input)
            )
    except BaseException as exc:  # noqa: BLE001 - sorted out below, control flow first
        escaped = exc
    if escaped is not None and shutdown.is_leaving(escaped):
        # The worker is shutting down around the body: nothing of this turn is the body's verdict.
        raise escaped
    ended = stopping.ended(ctx, escaped)
    if ctx._nondeterminism is not None and limits.park_nondeterminism:
        # Whatever the body did with it: nothing of this turn counts, nothing is compensated.
        return _failed(ctx._nondeterminism, state, blocked=True)
    if ended is not None:
        return ended if ctx._nondeterminism is None else _failed(ctx._nondeterminism, state)
    # A change of code (when not parked), or a primitive misused, fails the run even when the
    # body caught it.
    error = ctx._nondeterminism or ctx._stopping
    cancelled = None if error is not None else _cancelled(ctx, escaped)
    if cancelled is not None:
        return saga.unwind(ctx, cancelled) if (ctx._interrupt or {}).get("compensate") else cancelled
    if escaped is not None:
        # So does an error escaping the body, KeyboardInterrupt and SystemExit included (unless
        # the worker raised them to leave): they must not take the worker process down with them.
        failed = _failed(error or escaped, state)
        return saga.unwind(ctx, failed) if saga.needs_unwind(ctx) else failed
    if error is not None:
        return _failed(error, state)
    try:
        output = stored(
            value, what=f"the output of workflow {run.workflow!r}", max_bytes=limits.max_payload_bytes
        )
    except InvalidInput as exc:
        exc.code = ErrorCode.INVALID_OUTPUT
        return _failed(exc, state)
    return Decision(Decided.COMPLETED, output=output)


def _cancelled(ctx: Context, escaped: BaseException | None) -> Decision | None:
    """The decision for a body that let ``Cancelled`` escape: the run ends cancelled (None if the
    body ended otherwise). The reason is the request's, else the exception's own message."""
    if not isinstance(escaped, Cancelled):
        return None
    reason = (ctx._interrupt or {}).get("reason") or (escaped.message if ctx._interrupt is None else None)
    return Decision(Decided.CANCELLED, error=cancelled_error(reason))


def _failed(exc: BaseException, state: TurnState, *, blocked: bool = False) -> Decision:
    seqs: list[int] = []
    seen: set[int] = set()
    cursor: BaseException | None = exc
    while cursor is not None and id(cursor) not in seen:
        seen.add(id(cursor))
        seqs.extend(state.raised.get(id(cursor), []))
        cursor = cursor.__cause__ or cursor.__context__
    return Decision(Decided.FAILED, error=error_dict(exc), failed_seqs=sorted(set(seqs)), blocked=blocked)
