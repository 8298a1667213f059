"""Forks: a new run of a run's workflow and input whose history before a position is the old
run's, so its body replays those positions and runs on from there (DBOS's fork, Temporal's
reset): after a fix, an operator re-runs a failed run from its seventh step keeping the six
before it.

The copied positions are settled ones (a position still pending before ``at`` would run again,
or twice); each payload is written anew (a large one offloaded as its own object), so the fork's
history outlives its origin's retention. The fork is created with its history in one transaction
and counts as started, so its first turn reads that history.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from .. import clock, conf, guards
from ..definitions import registry
from ..errors import InvalidInput, RunNotFound
from ..models import Checkpoint, Run
from ..models.base import column_length
from ..statuses import CheckpointStatus
from . import runs

#: What a copied position keeps of its original: the rest (its id, its run) is the fork's own,
#: and nothing of a settled attempt is held or waiting.
_LEFT = {"id", "run"}


def fork(source_id: str, at: Any, *, run_id: str | None = None, version: str | None = None) -> str:
    """Create the fork of ``source_id`` at position ``at`` (or return run ``run_id`` if it is a
    fork of that run already); return its id."""
    settings = conf.get()
    db = settings.DATABASE
    source = Run.objects.using(db).filter(id=source_id).first()
    if source is None:
        raise RunNotFound(f"no run {source_id!r} to fork")
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise InvalidInput(f"at must be a position of run {source_id} (a whole number from 0), got {at!r}")
    if run_id is not None:
        run_id = guards.run_id(run_id, max_length=column_length("Run", "id"))
        existing = Run.objects.using(db).filter(id=run_id).first()
        if existing is not None:
            return _same_fork(existing, source, at)
    definition = registry.workflow(source.workflow, version or source.version)
    kept = list(Checkpoint.objects.using(db).filter(run_id=source_id, seq__lt=at).order_by("seq"))
    _check_history(source, at, kept)
    try:
        with transaction.atomic(using=db):
            new_id = runs.create(
                definition,
                source.input,
                run_id=run_id,
                namespace=source.namespace,
                tags=source.tags,
                queue_limit=False,
                # Started: its first turn reads the history copied here (a first claim reads none).
                started_at=clock.now(),
                forked_from_id=source.id,
                forked_at=at,
            )
            Checkpoint.objects.using(db).add([_copy(row, new_id) for row in kept])
            return new_id
    except IntegrityError:
        existing = Run.objects.using(db).filter(id=run_id).first() if run_id else None
        if existing is None:
            raise
        return _same_fork(existing, source, at)


def _check_history(source: Run, at: int, kept: list[Checkpoint]) -> None:
    last = Checkpoint.objects.using(conf.get().DATABASE).filter(run_id=source.id).order_by("-seq").first()
    end = last.seq + 1 if last is not None else 0
    if at > end:
        raise InvalidInput(
            f"run {source.id} has no position {at}: its history holds positions 0 to {end - 1}"
            if end
            else f"run {source.id} has no position {at}: its history is empty (fork it at 0)"
        )
    open_ = [row.seq for row in kept if row.status == CheckpointStatus.PENDING]
    if open_:
        raise InvalidInput(
            f"run {source.id}'s position {open_[0]} is still pending: a fork at {at} would run it "
            f"again; fork at {open_[0]} or before"
        )


def _copy(row: Checkpoint, run_id: str) -> Checkpoint:
    fields = {
        f.attname: getattr(row, f.attname) for f in Checkpoint._meta.concrete_fields if f.name not in _LEFT
    }
    # Settled: no process holds it, no message may settle it again.
    fields.update(held_by=None, held_until=None, token=None)
    return Checkpoint(run_id=run_id, **fields)


def _same_fork(existing: Run, source: Run, at: int) -> str:
    if (existing.forked_from_id, existing.forked_at) != (source.id, at):
        raise InvalidInput(
            f"run id {existing.id!r} is taken (by a run that is not the fork of {source.id} at {at}); "
            "pick another run_id"
        )
    return existing.id
