"""Beat sweeps: the repairs that make every run converge whatever messages were lost, and the
one list of every sweep that beat, ``manage.py durable sweep`` and the test harness run.

Each pass is bounded and idempotent; two beats running them at once only duplicate hints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from .. import clock, conf, dispatch, errors, wording
from ..models import Checkpoint, Run, Status
from ..models.base import commit_without_waiting
from . import debounce, entity_ops, flow, lifecycle, presence, redispatch, retention, schedules, singletons

log = logging.getLogger("durable.engine")

#: The orphan sweep's task: its passes are noted in the Presence table.
ORPHANS = "durable.sweep_orphans"

#: Batches one timer pass takes at most, so one pass stays short under a backlog.
MAX_BATCHES = 20

#: Where this process's last timer pass stopped inside a backlog, per (database, namespace,
#: status): the (due time, run id) of the last run it took. See ``sweep_timers``.
_resume: dict[tuple[str, str | None, str], tuple[datetime, str]] = {}


def sweep_timers() -> int:
    """Send a turn to every run whose timer, retry backoff or safety-net wake is due.

    A pass cut short by ``MAX_BATCHES`` leaves the next pass of this process to go on from the
    last run it took, as each batch does from the one before: a backlog is read once, not again
    from its head (where the old index entries of every run taken so far wait for vacuum) at
    each pass. A run that fell due behind that point meanwhile (a clock behind the others' set its
    timer, say) is taken when a pass reaches the end of the backlog and goes over the head again.
    """
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
    with transaction.atomic(using=settings.DATABASE):
        woken = singletons.repair()
    woken += flow.repair()
    # Debounced runs whose start fell due become due runs like any, taken below.
    debounce.admit_due()
    batches = 0
    # One status at a time, so each batch continues its index range where the one before ended.
    for status in (Status.SUSPENDED, Status.PENDING):
        key = (settings.DATABASE, settings.NAMESPACE, status)
        after = _resume.pop(key, None)
        resumed = after is not None
        while batches < MAX_BATCHES:
            batches += 1
            now = clock.now()
            with transaction.atomic(using=settings.DATABASE):
                # A batch lost in a crash is due again, and taken again by the next pass.
                commit_without_waiting(settings.DATABASE)
                # The next safety-net wake; the turn sets the real one when it settles.
                until = now + settings.RECONCILE_INTERVAL
                due = runs.take_due(now, until, settings.TIMER_BATCH_SIZE, status=status, after=after)
                dispatch.advance_many((run_id, queue) for run_id, queue, _ in due)
            woken += len(due)
            if len(due) == settings.TIMER_BATCH_SIZE:
                after = max((was_due, run_id) for run_id, _, was_due in due)
            elif resumed:  # the end of the backlog: once more from the head, for runs due behind
                resumed, after = False, None
            else:
                break
        else:
            if after is not None:
                _resume[key] = after
    return woken


def reset_passes() -> None:
    """Start this process's next timer pass from the head of the due range (a test's fresh
    environment: a pass of the test before left no place to go on from)."""
    _resume.clear()


def sweep_orphans() -> int:
    """Re-drive runs whose turn died holding its lease (past the budget they go ``dead``), and
    runs with a step attempt whose process stopped holding it (the turn counts it as lost);
    probe the queues holding step messages not taken for a while (``redispatch``)."""
    settings = conf.get()
    redispatch.probe_queues()
    before = abandoned_before(clock.now())
    recovered = lapsed_attempts(before)
    for _ in range(MAX_BATCHES):
        taken = recover(clock.now(), settings.TIMER_BATCH_SIZE, stale_before=before)
        recovered += taken
        if taken < settings.TIMER_BATCH_SIZE:
            break
    return recovered


def abandoned_before(now: datetime) -> datetime | None:
    """The instant a lease or hold must have lapsed before to count as abandoned: None for now,
    or, when the orphan sweep's passes stopped for a while, the last one before the gap.

    Passes stop when the database is away (a restart, a failover, an outage) or beat is, and a
    holder could not renew while the database was away either: a hold that lapsed in the gap
    belongs to a process that may well live on. It is judged at the next pass, once its holder
    (who retries a failed renewal within a second) had the time to renew it.
    """
    last = presence.last_pass(ORPHANS)
    if last is not None and now - last > 2 * conf.get().ORPHAN_SWEEP_INTERVAL:
        return last
    return None


def lapsed_attempts(before: datetime | None = None) -> int:
    """Wake the runs whose started step attempts lost their holder (their hold lapsed, before
    ``before`` if given), a batch at a time."""
    settings = conf.get()
    woken = 0
    for _ in range(MAX_BATCHES):
        now = clock.now()
        with transaction.atomic(using=settings.DATABASE):
            attempts = Checkpoint.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
            run_ids = attempts.lapsed(min(now, before or now), settings.TIMER_BATCH_SIZE)
            _wake(run_ids, now, settings)
        woken += len(run_ids)
        if len(run_ids) < settings.TIMER_BATCH_SIZE:
            break
    return woken


def _wake(run_ids: list[str], now: datetime, settings: conf.Settings) -> None:
    runs = Run.objects.using(settings.DATABASE)
    queues = [(run_id, runs.wake(run_id, now, now + settings.LEASE)) for run_id in run_ids]
    dispatch.advance_many((run_id, queue) for run_id, queue in queues if queue)


def reclaim(instance_id: str, booted_at: datetime) -> int:
    """Take back, at start-up, the leases a predecessor with this ``instance_id`` left behind.

    Only leases last renewed before this process booted: a lease still being renewed belongs to
    a live process (say a pool child that outlived its parent) and is left alone.
    """
    settings = conf.get()
    prefix = f"{instance_id}/"
    now, stale_before = clock.now(), booted_at + settings.LEASE
    with transaction.atomic(using=settings.DATABASE):
        attempts = (
            Checkpoint.objects.using(settings.DATABASE)
            .serving(settings.NAMESPACE)
            .let_go(prefix, stale_before, now, settings.TIMER_BATCH_SIZE)
        )
        _wake(attempts, now, settings)
    taken = recover(now, settings.TIMER_BATCH_SIZE, stale_before=stale_before, owner_prefix=prefix)
    return len(attempts) + taken


def recover(
    now: datetime,
    limit: int,
    *,
    stale_before: datetime | None = None,
    owner_prefix: str | None = None,
) -> int:
    """Recover a batch of orphaned runs in one transaction; send a turn to each one taken back."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE)
    with transaction.atomic(using=settings.DATABASE):
        outcome = runs.serving(settings.NAMESPACE).take_orphans(
            now,
            limit,
            settings.MAX_RECOVERY_ATTEMPTS,
            errors.recovery_exhausted(settings.MAX_RECOVERY_ATTEMPTS + 1),
            stale_before=stale_before,
            owner_prefix=owner_prefix,
        )
        for run in runs.filter(id__in=[run_id for run_id, _ in outcome[Status.DEAD]]):
            lifecycle.finished(run)
        dispatch.advance_many([*outcome["parked"], *outcome[Status.SUSPENDED]])
    return sum(len(taken) for taken in outcome.values())


@dataclass(frozen=True)
class Sweep:
    """One sweep: its Celery task, the setting that says how often beat sends it, and how
    ``manage.py durable sweep`` reports what a pass did."""

    task: str
    run: Callable[[], int]
    interval: str
    #: What a pass did, its count in place of ``{}``: "recovered {}".
    reports: str
    #: What the count counts, in the singular: "orphaned run".
    counts: str

    def report(self, did: int) -> str:
        return self.reports.format(wording.counted(did, self.counts))


#: Every sweep, in the order ``manage.py durable sweep`` and ``durable_env.sweep()`` run them.
SWEEPS = (
    Sweep(ORPHANS, sweep_orphans, "ORPHAN_SWEEP_INTERVAL", "recovered {}", "orphaned run"),
    Sweep("durable.sweep_timers", sweep_timers, "TIMER_SWEEP_INTERVAL", "woke {}", "due run"),
    Sweep(
        "durable.sweep_schedules",
        schedules.sweep_schedules,
        "TIMER_SWEEP_INTERVAL",
        "started {}",
        "scheduled run",
    ),
    Sweep(
        "durable.sweep_entities",
        entity_ops.sweep_entities,
        "ENTITY_SWEEP_INTERVAL",
        "prompted {} with ops pending",
        "entity key",
    ),
    Sweep(
        "durable.sweep_retention",
        retention.sweep_retention,
        "RETENTION_SWEEP_INTERVAL",
        "deleted {}",
        "finished run",
    ),
)


def run_noted(task: str) -> int:
    """Run the sweep sent as Celery task ``task`` once and note the pass in the Presence table,
    where a stuck run's diagnosis and the health page see when beat last swept.

    Logged at INFO only when the pass did something: an idle system's sweeps are quiet.
    """
    sweep = next(s for s in SWEEPS if s.task == task)
    did = sweep.run()
    try:
        presence.sweep_ran(task, did)
    except Exception:  # noqa: BLE001 - the pass itself is done; only its note is missing
        log.warning("durable: could not note the pass of %s", task, exc_info=True)
    log.log(logging.INFO if did else logging.DEBUG, "durable: %s %s", task, sweep.report(did))
    return did
