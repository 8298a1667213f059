"""Updates and queries from outside a run: an update vetted by the workflow's validator, then
delivered; the reply a body recorded for it; the values a run exposed.

The reads are one indexed row each, for callers that poll them (``durable.update(wait=...)``,
``durable.query(timeout=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import conf
from ..definitions import registry
from ..errors import RunFinished, RunNotFound, UpdateRejected, error_dict
from ..models import TERMINAL, Checkpoint, Signal
from ..statuses import UPDATE_WAITS
from ..values import decode
from . import runs


def update(run_id: str, name: str, payload: Any, *, idempotency_key: str | None = None) -> int:
    """Deliver ``payload`` as update ``name`` if the workflow's validator for ``name`` accepts it;
    return the update's id (the kept one's, for a key this run has already received)."""
    run = runs.get_run(run_id)
    if idempotency_key is not None:
        signals = Signal.objects.using(conf.get().DATABASE)
        kept = signals.keyed(run_id, idempotency_key, finished=run.status in TERMINAL)
        if kept is not None:
            return kept.id  # a repeat: its caller waits for the first one's reply
    if run.status in TERMINAL:
        raise RunFinished(f"run {run_id!r} has already finished ({run.status}); nothing was sent")
    validator = registry.workflow(run.workflow, run.version).validators.get(name)
    if validator is not None:
        try:
            validator(decode(payload))  # the payload as sent, not as stored
        except Exception as exc:  # noqa: BLE001 - the validator's refusal, whatever its type
            raise UpdateRejected(
                f"update {name!r} of run {run_id!r} was refused: {exc}", details=error_dict(exc)
            ) from exc
    return runs.deliver(run_id, name, payload, idempotency_key=idempotency_key, update=True)


@dataclass(frozen=True)
class Answer:
    """How an update stands for its caller."""

    #: Whether the body answered it (with ``reply``), or took it with a signal wait, which
    #: never answers: both end a caller's wait.
    replied: bool
    reply: Any
    taken_as_signal: bool
    #: The status of the run it was sent to, and whether a wait of that run took it.
    run_status: str
    taken: bool


def answer(update_id: int) -> Answer:
    """How update ``update_id`` stands; RunNotFound if it (and so its run) is gone."""
    db = conf.get().DATABASE
    row = (
        Signal.objects.using(db)
        .filter(id=update_id)
        .values_list("replied_at", "reply", "run__status", "run_id", "consumed_seq")
        .first()
    )
    if row is None:
        raise RunNotFound(f"update {update_id} is gone: its run was deleted")
    replied_at, reply, status, run_id, consumed_seq = row
    as_signal = (
        replied_at is None
        and consumed_seq is not None
        and Checkpoint.objects.using(db)
        .filter(run_id=run_id, seq=consumed_seq)
        .exclude(kind__in=UPDATE_WAITS)
        .exists()
    )
    return Answer(replied_at is not None, reply, as_signal, status, consumed_seq is not None)


def exposed(run_id: str) -> tuple[str, str, dict[str, Any]]:
    """(id, status, exposed values) of the run, or of the newest run of the continue-as-new chain
    it completed into (which starts with its predecessor's values)."""
    run = runs.follow(run_id)
    return run.id, run.status, dict(run.exposed or {})
