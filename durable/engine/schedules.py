"""The schedule sweep: start one run per due tick of each persisted cron schedule.

A tick is taken by a guarded UPDATE of the schedule's ``next_at`` in the same transaction that
starts its run, whose id names the tick: two sweeps at once start it once. Ticks missed while no
beat ran are not replayed; the latest of them runs. A schedule that fails, whatever the cause (a
cron stored before it was refused, a workflow gone, a database error), is logged and skipped: the
others still fire.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from django.db import transaction

from .. import clock, conf, guards
from ..definitions import Schedule, registry
from ..errors import DurableError
from ..models import UNFINISHED, CronSchedule, Run
from ..values import decode, json_value
from . import runs

log = logging.getLogger("durable.engine")

BATCH = 100
MAX_BATCHES = 20


def next_tick(cron: str, tz: str, after: datetime) -> datetime:
    """The first tick strictly after ``after``, in UTC."""
    return croniter(cron, after.astimezone(ZoneInfo(tz))).get_next(datetime).astimezone(UTC)


def latest_tick(cron: str, tz: str, due: datetime, now: datetime) -> datetime:
    """The newest tick at or before ``now``, and not before ``due`` (the tick that was due)."""
    newest = croniter(cron, (now + timedelta(microseconds=1)).astimezone(ZoneInfo(tz))).get_prev(datetime)
    return max(due, newest.astimezone(UTC))


def run_id(key: str, tick: datetime) -> str:
    return f"{guards.SCHEDULE_PREFIX}{key}:{tick.astimezone(UTC).isoformat()}"


def sweep_schedules() -> int:
    """Start the runs of every due tick; return how many were started."""
    settings = conf.get()
    sync_declared()
    started = 0
    broken: set[str] = set()  # failed this sweep: still due, but not taken again until the next
    for _ in range(MAX_BATCHES):
        with transaction.atomic(using=settings.DATABASE):
            now = clock.now()
            rows = CronSchedule.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
            due = rows.exclude(key__in=broken).due(now, BATCH)
            for row in due:
                fired = _fire_alone(row, now)
                if fired is None:
                    broken.add(row.key)
                started += bool(fired)
        if len(due) < BATCH:
            break
    return started


def _fire_alone(row: CronSchedule, now: datetime) -> bool | None:
    """``_fire`` in a savepoint of its own: None (logged, rolled back) when it failed."""
    try:
        with transaction.atomic(using=conf.get().DATABASE):
            return _fire(row, now)
    except Exception:  # noqa: BLE001 - one schedule's failure must never stop the others
        log.exception(
            "durable: schedule %s (cron %r, workflow %s) failed and was skipped",
            row.key,
            row.cron,
            row.workflow,
        )
        return None


def _fire(row: CronSchedule, now: datetime) -> bool:
    """Take ``row``'s due tick and start its run, unless overlap="skip" finds the last one unfinished."""
    schedules = CronSchedule.objects.using(conf.get().DATABASE)
    tick = latest_tick(row.cron, row.timezone, row.next_at, now)
    following = next_tick(row.cron, row.timezone, tick)
    busy = (
        row.overlap == "skip"
        and row.last_run_id is not None
        and Run.objects.using(conf.get().DATABASE).filter(id=row.last_run_id, status__in=UNFINISHED).exists()
    )
    new_id = None if busy else run_id(row.key, tick)
    if not schedules.advance(row.key, row.next_at, following, new_id, now):
        return False  # another sweep took this tick
    if new_id is None:
        log.info(
            "durable: schedule %s skipped its %s tick: run %s is still going", row.key, tick, row.last_run_id
        )
        return False
    try:
        runs.start(row.workflow, decode(row.input), run_id=new_id, namespace=row.namespace)
    except DurableError as exc:
        # Not registered here, an input its workflow now refuses, a full singleton line: this
        # tick is lost, the next ones are not, and the sweep goes on with the other schedules.
        log.warning(
            "durable: schedule %s could not start %s for its %s tick: %s", row.key, row.workflow, tick, exc
        )
        return False
    return True


def sync_declared() -> None:
    """Keep the schedules of ``@durable.workflow(schedule=...)`` (key: the workflow's name) in
    step with the code: create, update, or delete the ones the code no longer declares."""
    schedules = CronSchedule.objects.using(conf.get().DATABASE)
    now = clock.now()
    stored = {row.key: row for row in schedules.filter(declared=True)}
    for name in list(registry.workflows):
        row = stored.pop(name, None)
        spec = registry.workflow(name).schedule
        # Most workflows declare no schedule and have none stored: every sweep passes them all,
        # so only one with something to write opens a savepoint.
        if (row is None and spec is None) or (
            row is not None and spec is not None and not _changed(row, spec)
        ):
            continue
        try:
            with transaction.atomic(using=conf.get().DATABASE):
                _sync_one(name, spec, now)
        except Exception:  # noqa: BLE001 - one workflow's schedule must never stop the others
            log.exception("durable: the schedule declared on workflow %s could not be saved; skipped", name)


def _sync_one(name: str, spec: Schedule | None, now: datetime) -> None:
    """Delete the stored schedule of ``name`` (``spec`` None) or save it as declared."""
    if spec is None:
        CronSchedule.objects.using(conf.get().DATABASE).filter(key=name, declared=True).delete()
    else:
        save(name, name, spec, now, declared=True)


def _changed(row: CronSchedule, spec: Schedule) -> bool:
    return (row.cron, row.timezone, row.input, row.overlap) != (
        spec.cron,
        spec.timezone,
        spec.input,
        spec.overlap,
    )


def save(
    key: str, workflow: str, spec: Schedule, now: datetime, *, declared: bool, namespace: str = ""
) -> None:
    """Create or redefine schedule ``key``; a new cron or timezone counts its next tick from now."""
    settings = conf.get()
    json_value(spec.input, "the schedule's input", max_bytes=settings.MAX_PAYLOAD_BYTES)
    schedules = CronSchedule.objects.using(settings.DATABASE)
    row = schedules.filter(key=key).first()
    timing_changed = row is None or (row.cron, row.timezone) != (spec.cron, spec.timezone)
    fields = {
        "workflow": workflow,
        "input": spec.input,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "overlap": spec.overlap,
        "declared": declared,
        "namespace": namespace,
        "updated_at": now,
    }
    if timing_changed:
        fields["next_at"] = next_tick(spec.cron, spec.timezone, now)
    if row is None:
        schedules.create(key=key, created_at=now, **fields)
    else:
        schedules.filter(key=key).update(**fields)
