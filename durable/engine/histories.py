"""Stored histories read back for a replay check or an export: in batches, never written.

``check_stored`` replays the histories of stored runs against the workflow code installed now
(``manage.py durable replay``), a batch of runs and their positions in two queries at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any, NamedTuple

from .. import clock, conf
from ..definitions import registry
from ..errors import WorkflowNotRegistered
from ..models import Checkpoint, Run, Signal
from ..replay import check
from ..replay.history import BufferedSignal, Record
from ..replay.turnstate import RunFacts

#: Runs (with their positions) read per query.
BATCH = 200
_RUN_FIELDS = ("id", "workflow", "version", "namespace", "input", "status", "updated_at")


class Positions(NamedTuple):
    """A run's positions as a turn read them, and a time taken before the read: what they say
    of attempts running elsewhere (beats, holds, takes) is known as of then, not later."""

    records: dict[int, Record]
    read_at: datetime


def stored(run_id: str, db: str) -> dict[int, Record]:
    """The replay core's records of ``run_id``'s stored positions, by position."""
    return _records([run_id], db)[run_id]


def read(run_id: str, db: str) -> Positions:
    """``stored``, with when: a turn's read."""
    at = clock.now()
    return Positions(stored(run_id, db), at)


def unconsumed_signals(run_id: str, db: str) -> list[BufferedSignal]:
    """The signals and updates sent to ``run_id`` that no position has taken yet, oldest first."""
    rows = Signal.objects.using(db).filter(run_id=run_id, consumed_seq__isnull=True).order_by("id")
    return [BufferedSignal(s.id, s.name, s.payload, update=s.is_update) for s in rows]


def workflow_and_status(run_id: str, db: str) -> tuple[str, str] | None:
    """Another run's workflow and status, as a body that signals it asks (None: no such run)."""
    found = Run.objects.using(db).filter(id=run_id).values_list("workflow", "status").first()
    return (found[0], found[1]) if found is not None else None


def _facts(run: Run) -> RunFacts:
    return RunFacts(run.id, run.workflow, run.version, run.namespace or None, run.input)


#: What a record holds of a stored position (read as plain values: no model instances).
RECORD_FIELDS = (
    "seq",
    "kind",
    "name",
    "status",
    "attempt",
    "input",
    "output",
    "error",
    "wake_at",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_heartbeat_at",
    "queue",
    "fan",
    "fail_fast",
    "token",
    "held_until",
    "held_by",
    "flow",
    "flow_key",
    "redispatches",
)


def records(positions: list[dict[str, Any]]) -> dict[int, Record]:
    """The replay core's records of positions read as dicts of ``RECORD_FIELDS``, by position."""
    found = {}
    for position in positions:
        rec = Record(**position)
        rec.stored_as = (rec.status, rec.attempt)
        found[rec.seq] = rec
    return found


def _records(run_ids: list[str], db: str) -> dict[str, dict[int, Record]]:
    found: dict[str, dict[int, Record]] = {run_id: {} for run_id in run_ids}
    if len(run_ids) == 1:
        # A turn's read, on every turn: one plain statement, not a compiled query.
        rows = Checkpoint.objects.using(db).history(run_ids[0], ("run_id", *RECORD_FIELDS))
    else:
        query = Checkpoint.objects.using(db).filter(run_id__in=run_ids).order_by("run_id", "seq")
        rows = query.values_list("run_id", *RECORD_FIELDS)
    for run_id, *values in rows:
        rec = Record(**dict(zip(RECORD_FIELDS, values, strict=True)))
        rec.stored_as = (rec.status, rec.attempt)
        found[run_id][rec.seq] = rec
    return found


def selected(
    *, workflow: str | None = None, since: datetime | None = None, run_ids: list[str] | None = None
) -> Any:
    """The runs a check or a listing looks at, oldest first."""
    runs = Run.objects.using(conf.get().DATABASE).all()
    if workflow:
        runs = runs.filter(workflow=workflow)
    if since is not None:
        runs = runs.filter(created_at__gte=since)
    if run_ids:
        runs = runs.filter(id__in=run_ids)
    return runs


def check_stored(
    *, workflow: str | None = None, since: datetime | None = None, run_ids: list[str] | None = None
) -> Iterator[check.Verdict]:
    """Replay each selected run's history against the code installed now; yield a verdict per run."""
    db = conf.get().DATABASE
    runs = selected(workflow=workflow, since=since, run_ids=run_ids).only(*_RUN_FIELDS).order_by("id")
    after = ""
    while True:
        batch = list(runs.filter(id__gt=after)[:BATCH])
        if not batch:
            return
        after = batch[-1].id
        histories = _records([run.id for run in batch], db)
        for run in batch:
            yield verdict(run, histories[run.id])


def verdict(run: Run, records: dict[int, Record]) -> check.Verdict:
    facts = _facts(run)
    try:
        definition = registry.workflow(run.workflow, run.version)
    except WorkflowNotRegistered as exc:
        return check.Verdict(run.id, run.workflow, run.version, len(records), exc)
    return check.check(definition, facts, records, at=run.updated_at)


def export(run: Run) -> dict[str, Any]:
    """``run``'s history as JSON, for ``durable.testing.replay_history`` (see ``check.to_json``)."""
    records = _records([run.id], conf.get().DATABASE)[run.id]
    return check.to_json(
        _facts(run),
        records,
        at=run.updated_at,
        status=run.status,
        created_at=run.created_at.isoformat() if run.created_at else None,
    )
