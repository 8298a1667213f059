"""The retention sweep: delete the finished runs that no RETENTION policy keeps any longer, and
the events past EVENT_BUFFER_TTL.

Whole trees only: a candidate is a root run (no parent) and goes with its children, checkpoints
and signals; a tree that still holds an unfinished run (a child started with ``start_child``,
say) is kept until it finishes. Each pass is bounded; a backlog drains over several passes.

On a partitioned history (PostgreSQL, ``models.partitions``) a pass first keeps the days ahead
made, then drops each past day whose every run has expired under a ``max_age`` policy: its pair
of tables goes in one short transaction, and nothing is left for vacuum. The rows of a day that
cannot go whole (a run kept by another policy, or still running) are deleted row by row as
before, but only once ``DAY_GRACE`` past their policy, so that a day about to go whole is not
deleted row by row first: on a partitioned history a run outlives its ``max_age`` by up to a day.
"""

from __future__ import annotations

import logging
import operator
from datetime import UTC, date, datetime, timedelta
from functools import reduce

from django.db import DatabaseError, transaction
from django.db.models import Exists, OuterRef, Q

from .. import clock, conf
from ..models import Event, Run, Status, partitions
from ..models.base import commit_without_waiting
from ..models.offloads import any_offloaded
from ..signals import run_evicting
from ..statuses import TERMINAL, UNFINISHED
from . import offloads, presence

log = logging.getLogger("durable.engine")

#: Root runs one batch considers, and batches one policy takes per pass.
BATCH = 500
MAX_BATCHES = 20
#: How long past its policy a run of a partitioned history waits for its day to go whole.
DAY_GRACE = timedelta(days=1)
#: How long a day found holding a run that must stay is left before it is checked again (a check
#: may read the whole day), and until when each such day is left, in this process.
RECHECK_KEPT_DAY = timedelta(hours=1)
_kept_until: dict[date, datetime] = {}


def sweep_retention() -> int:
    """Apply every RETENTION policy once; return how many runs (children included) were deleted."""
    settings = conf.get()
    # The days are made for the ids runs get, which come from the wall clock, not durable's.
    partitions.ensure_ahead(settings.DATABASE, datetime.now(UTC))
    held = None
    deleted = 0
    if drops_days(settings):
        deleted = drop_expired_days(settings, clock.now())
        made = partitions.days(settings.DATABASE)
        held = (made[0].low, made[-1].high) if made else None
    for policy in settings.RETENTION:
        for _ in range(MAX_BATCHES):
            candidates = expired(policy, clock.now(), BATCH, held_by_days=held)
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


def drops_days(settings: conf.Settings) -> bool:
    """Whether retention drops whole days: a partitioned history, a ``max_age`` policy, and no
    ``run_evicting`` receiver (it must hear of each tree, which a day's drop does not tell)."""
    if not any(policy.max_age is not None for policy in settings.RETENTION) or run_evicting.receivers:
        return False
    return partitions.is_partitioned(settings.DATABASE)


def drop_expired_days(settings: conf.Settings, now: datetime) -> int:
    """Drop each day of the history whose every run has expired; return how many runs went."""
    db = settings.DATABASE
    youngest = min(policy.max_age for policy in settings.RETENTION if policy.max_age is not None)
    # A day may go only once its last run started before now - youngest: no later day can.
    horizon = partitions.bound(now - youngest)
    offloaded = any_offloaded(db)
    dropped = 0
    for day in partitions.days(db):
        if day.high > horizon:
            break
        if _kept_until.get(day.day, now) > now:
            continue
        try:
            with transaction.atomic(using=db):
                gone = Run.objects.using(db).delete_day(
                    day, ~_gone_with(day, settings, now), offloaded=offloaded
                )
        except DatabaseError as exc:  # a lock not had within partitions.LOCK_TIMEOUT: next pass
            log.info("durable: retention left day %s for its next pass: %s", day.day, exc)
            continue
        if gone:
            log.info("durable: retention dropped day %s of the history (%s runs)", day.day, gone)
        else:
            _kept_until[day.day] = now + RECHECK_KEPT_DAY
        dropped += gone
    return dropped


def _gone_with(day: partitions.Day, settings: conf.Settings, now: datetime) -> Q:
    """The runs that may go with ``day``: finished, and either a root past a ``max_age`` policy or
    a child of a run of the same day (its tree's root then is such a root)."""
    past = []
    for policy in settings.RETENTION:
        if policy.max_age is not None:
            matched = Q(status__in=policy.statuses, finished_at__lt=now - policy.max_age)
            past.append(matched & Q(workflow__in=policy.workflows) if policy.workflows else matched)
    gone = Q(status__in=TERMINAL) & (
        (Q(parent__isnull=True) & reduce(operator.or_, past))
        | Q(parent_id__gte=day.low, parent_id__lt=day.high)
    )
    if settings.NAMESPACE:
        gone &= Q(namespace=settings.NAMESPACE)
    return gone


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


def expired(
    policy: conf.RetentionPolicy, now: datetime, limit: int, *, held_by_days: tuple[str, str] | None = None
) -> list[str]:
    """Ids of finished root runs past ``policy``, oldest first, at most ``limit``. With
    ``held_by_days`` (the span of run ids the days of a partitioned history cover) a run of the
    span is past a ``max_age`` only DAY_GRACE later, left to its day's drop until then."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
    runs = runs.filter(status__in=policy.statuses, parent__isnull=True)
    if policy.workflows:
        runs = runs.filter(workflow__in=policy.workflows)
    # Skipped here already (not only in delete_trees), so kept trees cannot fill every batch.
    runs = runs.exclude(Exists(Run.objects.filter(parent_id=OuterRef("id"), status__in=UNFINISHED)))
    ids: list[str] = []
    if policy.max_age is not None:
        old = runs.filter(finished_at__lt=now - policy.max_age)
        if held_by_days:
            low, high = held_by_days
            old = old.exclude(id__gte=low, id__lt=high, finished_at__gte=now - policy.max_age - DAY_GRACE)
        old = old.order_by("finished_at", "id")
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
