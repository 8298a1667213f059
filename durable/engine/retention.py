"""The retention sweep: delete the finished runs that no RETENTION policy keeps any longer, and
the events past EVENT_BUFFER_TTL.

Whole trees only: a candidate is a root run (no parent) and goes with its children, checkpoints
and signals; a tree that still holds an unfinished run (a child started with ``start_child``,
say) is kept until it finishes. Each pass is bounded; a backlog drains over several passes.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import Exists, OuterRef

from .. import clock, conf
from ..models import Event, Run
from ..statuses import TERMINAL, UNFINISHED

log = logging.getLogger("durable.engine")

#: Root runs one batch considers, and batches one policy takes per pass.
BATCH = 500
MAX_BATCHES = 20


def sweep_retention() -> int:
    """Apply every RETENTION policy once; return how many runs (children included) were deleted."""
    settings = conf.get()
    deleted = 0
    for policy in settings.RETENTION:
        for _ in range(MAX_BATCHES):
            candidates = expired(policy, clock.now(), BATCH)
            gone = delete_trees(candidates)
            deleted += gone
            if len(candidates) < BATCH or not gone:
                break
    pruned = prune_events(clock.now() - settings.EVENT_BUFFER_TTL)
    if deleted or pruned:
        log.info("durable: retention deleted %s finished run(s) and %s expired event(s)", deleted, pruned)
    return deleted


def prune_events(before: datetime) -> int:
    """Delete events older than EVENT_BUFFER_TTL, which no wait can receive any more."""
    events = Event.objects.using(conf.get().DATABASE)
    pruned = 0
    for _ in range(MAX_BATCHES):
        batch = list(
            events.filter(created_at__lt=before).order_by("created_at").values_list("id", flat=True)[:BATCH]
        )
        pruned += events.filter(id__in=batch).delete()[0] if batch else 0
        if len(batch) < BATCH:
            break
    return pruned


def expired(policy: conf.RetentionPolicy, now: datetime, limit: int) -> list[str]:
    """Ids of finished root runs past ``policy``, oldest first, at most ``limit``."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
    runs = runs.filter(status__in=policy.statuses, parent__isnull=True)
    if policy.workflows:
        runs = runs.filter(workflow__in=policy.workflows)
    # Skipped here already (not only in delete_trees), so kept trees cannot fill every batch.
    runs = runs.exclude(Exists(Run.objects.filter(parent_id=OuterRef("id"), status__in=UNFINISHED)))
    ids: list[str] = []
    if policy.max_age is not None:
        old = runs.filter(finished_at__lt=now - policy.max_age).order_by("finished_at", "id")
        ids = list(old.values_list("id", flat=True)[:limit])
    if policy.max_count is not None and len(ids) < limit:
        newest_first = runs.order_by("-finished_at", "-id").values_list("id", flat=True)
        seen = set(ids)
        ids += [i for i in newest_first[policy.max_count : policy.max_count + limit] if i not in seen]
    return ids[:limit]


def delete_trees(root_ids: list[str]) -> int:
    """Delete these finished roots with their subtrees, except trees holding an unfinished run."""
    if not root_ids:
        return 0
    db = conf.get().DATABASE
    runs = Run.objects.using(db)
    with transaction.atomic(using=db):
        # Locked, and still finished: a retry() racing this pass either reopened the run first
        # (then it is not deleted) or waits and finds it gone.
        roots = list(
            runs.select_for_update().filter(id__in=root_ids, status__in=TERMINAL).values_list("id", flat=True)
        )
        keep = _with_unfinished(roots)
        doomed = [i for i in roots if i not in keep]
        if not doomed:
            return 0
        _, per_model = runs.filter(id__in=doomed).delete()
    return per_model.get(Run._meta.label, 0)


def _with_unfinished(roots: list[str]) -> set[str]:
    """Roots whose subtree holds a run that has not finished."""
    runs = Run.objects.using(conf.get().DATABASE)
    root_of = {run_id: run_id for run_id in roots}
    blocked: set[str] = set()
    frontier = list(roots)
    while frontier:
        level = list(runs.filter(parent_id__in=frontier).values_list("id", "parent_id", "status"))
        frontier = []
        for run_id, parent_id, status in level:
            root_of[run_id] = root_of[parent_id]
            if status in UNFINISHED:
                blocked.add(root_of[run_id])
            frontier.append(run_id)
    return blocked
