"""Replay a stored history against the workflow code installed now, with no side effects, and
say whether that code would break the run (``NonDeterminismError``): the check before a deploy.

The body is walked over the recorded positions only. It stops at the first position the history
does not hold yet, before anything new is decided; nothing runs (a pending local step is not
retried), nothing is sent or written. Pure: no ORM, no Celery.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..definitions import Step, Workflow, body_scope
from ..errors import DurableError, InvalidInput, _ControlFlow
from . import asyncbody, asynccontext
from .context import Context
from .history import Limits, Record
from .positions import Pending
from .saga import COMPENSATION_BASE
from .turnstate import RunFacts, TurnState

#: Settings the walk needs; they decide only what a new position would do, never reached here.
_LIMITS = Limits(
    reconcile_interval=timedelta(minutes=5),
    redispatch_after=timedelta(days=36500),
    timeout_grace=timedelta(days=36500),
    heartbeat_throttle=timedelta(seconds=10),
    default_queue="durable",
)


class _EndOfHistory(_ControlFlow):
    """The body asked for a position past the last recorded one: everything recorded replayed."""


class _Checking(Context):
    """A context that answers only from the history and never runs a step."""

    def _run_local(self, rec: Record, step: Step) -> Any:
        return Pending(None)  # a pending local step would run now: not during a check


class _AsyncChecking(_Checking, asyncbody.BodyContext):
    """The same, for an ``async def`` body."""


@dataclass(frozen=True)
class Verdict:
    """How the installed code replays one history: ``error`` is None when it replays; else a
    ``NonDeterminismError``, a ``WorkflowNotRegistered`` (no code for the run's workflow and
    version) or an ``InvalidInput`` (the stored input no longer fits the ``input_schema``)."""

    run_id: str
    workflow: str
    version: str
    positions: int
    error: DurableError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def check(
    workflow: Workflow,
    run: RunFacts,
    records: dict[int, Record],
    *,
    at: datetime | None = None,
) -> Verdict:
    """Walk ``workflow``'s body over ``records`` (a run's history, by position); say whether the
    body asks, at some recorded position, for something other than what the history holds.

    ``at`` is the clock the body sees (the time the history was last written is a good choice:
    recorded timers and retries then stand as they stood).
    """
    body = {seq: rec for seq, rec in records.items() if seq < COMPENSATION_BASE}
    until = max(body, default=-1)
    state = TurnState(records=records)
    now = at or datetime.now(UTC)
    try:
        given = workflow.body_input(run.input)
    except InvalidInput as exc:
        return Verdict(run.id, run.workflow, run.version, len(body), exc)
    facts = RunFacts(run.id, run.workflow, run.version, run.namespace, given)
    ctx: _Checking | _AsyncChecking

    def past_history() -> BaseException | None:
        if ctx._nondeterminism is None and ctx._next > until:
            return _EndOfHistory()
        return None

    body_async = asyncbody.is_async(workflow.fn)
    ctx = (_AsyncChecking if body_async else _Checking)(
        facts,
        state,
        clock=lambda: now,
        limits=_LIMITS,
        flush=lambda _state: None,
        renew=lambda: None,
        stopped=past_history,
    )
    try:
        with body_scope(run.workflow):
            asynccontext.run(workflow.fn, ctx, given) if body_async else workflow.fn(ctx, given)
    except BaseException:  # noqa: BLE001, S110 - how the body ends is the history's business
        pass
    return Verdict(run.id, run.workflow, run.version, len(body), ctx._nondeterminism)


#: The format of an exported history (``manage.py durable show RUN --json``).
FORMAT = "durable.history/1"
_TIMES = ("wake_at", "enqueued_at", "started_at", "finished_at", "last_heartbeat_at")
_FIELDS = (
    "seq",
    "kind",
    "name",
    "status",
    "attempt",
    "input",
    "output",
    "error",
    "queue",
    "fan",
    "fail_fast",
)


def to_json(
    run: RunFacts, records: dict[int, Record], *, at: datetime | None, **about: Any
) -> dict[str, Any]:
    """A run's history as JSON: its facts, its positions in order, and ``about`` (status ...)."""
    positions = []
    for seq in sorted(records):
        rec = records[seq]
        item = {name: getattr(rec, name) for name in _FIELDS}
        item.update({name: _iso(getattr(rec, name)) for name in _TIMES})
        positions.append(item)
    return {
        "format": FORMAT,
        "run": {
            "id": run.id,
            "workflow": run.workflow,
            "version": run.version,
            "namespace": run.namespace,
            "input": run.input,
            "at": _iso(at),
            **about,
        },
        "positions": positions,
    }


def from_json(data: Any) -> tuple[RunFacts, dict[int, Record], datetime | None]:
    """The run facts, history and clock of an exported history (see ``to_json``)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidInput(
            f"not an exported durable history (expected a JSON object with format {FORMAT!r}); "
            "export one with `manage.py durable show RUN --json`"
        )
    run = data["run"]
    facts = RunFacts(run["id"], run["workflow"], str(run["version"]), run.get("namespace"), run.get("input"))
    records = {}
    for item in data["positions"]:
        rec = Record(**{name: item[name] for name in _FIELDS if name in item})
        for name in _TIMES:
            setattr(rec, name, _parse(item.get(name)))
        rec.stored_as = (rec.status, rec.attempt)
        records[rec.seq] = rec
    return facts, records, _parse(run.get("at"))


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def _parse(when: str | None) -> datetime | None:
    return None if when is None else datetime.fromisoformat(when)
