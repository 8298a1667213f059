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
from ..models import Event, Run, Status
from ..models.base import commit_without_waiting
from ..models.offloads import any_offloaded
from ..signals import run_evicting
from ..statuses import TERMINAL, UNFINISHED
from . import offloads, presence

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
    presence.prune()
    offloads.sweep_offloads()
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
        offloaded = any_offloaded(db)
        if not offloaded:
            # A pass a crash undoes is done again by the next one. Not with objects offloaded:
            # they are purged once the commit returns, and must not outlive a lost delete.
            commit_without_waiting(db)
        # Locked, and still finished: a retry() racing this pass either reopened the run first
        # (then it is not deleted) or waits and finds it gone.
        roots = list(
            runs.select_for_update().filter(id__in=root_ids, status__in=TERMINAL).values_list("id", flat=True)
        )
        trees = _trees(roots)
        keep = _with_unfinished(trees)
        doomed = [i for i in roots if i not in keep and _let_go(i, trees[i])]
        if not doomed:
            return 0
        # Each tree read root first, a level at a time: reversed, every run goes after its subtree.
        doomed_ids = [run_id for root in doomed for run_id, _ in reversed(trees[root])]
        return runs.delete_in_order(doomed_ids, offloaded=offloaded)


def _trees(roots: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Each root's subtree as (run id, status), the root first, one query per level."""
    runs = Run.objects.using(conf.get().DATABASE)
    root_of = {run_id: run_id for run_id in roots}
    trees: dict[str, list[tuple[str, str]]] = {run_id: [(run_id, Status.COMPLETED)] for run_id in roots}
    frontier = list(roots)
    while frontier:
        level = runs.children_of(frontier, "id", "parent_id", "status")
        frontier = []
        for run_id, parent_id, status in level:
            root_of[run_id] = root_of[parent_id]
            trees[root_of[run_id]].append((run_id, status))
            frontier.append(run_id)
    return trees


def _with_unfinished(trees: dict[str, list[tuple[str, str]]]) -> set[str]:
    """Roots whose subtree holds a run that has not finished (the roots were locked finished)."""
    return {root for root, tree in trees.items() if any(status in UNFINISHED for _, status in tree)}


def _let_go(root_id: str, tree: list[tuple[str, str]]) -> bool:
    """Ask the ``run_evicting`` receivers; False (the tree is kept) when one of them raised."""
    if not run_evicting.receivers:
        return True
    db = conf.get().DATABASE
    # A savepoint, rolled back when a receiver raised: one whose query failed must not abort the
    # deleting transaction for the other trees.
    with transaction.atomic(using=db):
        root = Run.objects.using(db).get(id=root_id)
        answers = run_evicting.send_robust(sender=Run, run=root, run_ids=[run_id for run_id, _ in tree])
        failed = [(receiver, answer) for receiver, answer in answers if isinstance(answer, Exception)]
        if failed:
            transaction.set_rollback(True, using=db)
    for receiver, exc in failed:
        log.error(
            "durable: a run_evicting receiver (%s) raised, so run %s and its tree are kept: %r",
            getattr(receiver, "__qualname__", receiver),
            root_id,
            exc,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
    return not failed
