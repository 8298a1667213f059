"""Persisted cron schedules from views, shells and tasks."""

from __future__ import annotations

from typing import Any

from . import clock, conf, guards
from .api import RunHandle
from .calls import column_length
from .definitions import Schedule, Workflow
from .errors import InvalidInput
from .values import decode


def schedule(
    key: str,
    workflow: Workflow | str,
    *,
    cron: str,
    input: Any = None,
    timezone: str = "UTC",
    overlap: str = "skip",
    namespace: str | None = None,
) -> None:
    """Create or redefine the schedule ``key``: each tick of ``cron`` (in ``timezone``) starts one
    run of ``workflow`` with ``input``, id ``schedule:<key>:<tick>``, in ``namespace`` (default:
    ``DURABLE["NAMESPACE"]``)."""
    from .engine import runs, schedules

    _check_key(key)
    if isinstance(workflow, str):
        guards.text(workflow, "workflow", max_length=column_length("CronSchedule", "workflow"))
    definition = runs.resolve(workflow, None)
    guards.text(cron, "cron", max_length=column_length("CronSchedule", "cron"))
    if namespace is not None:
        guards.namespace(namespace, max_length=column_length("CronSchedule", "namespace"))
    spec = Schedule(cron=cron, input=input, timezone=timezone, overlap=overlap)
    namespace = namespace if namespace is not None else (conf.get().NAMESPACE or "")
    schedules.save(key, definition.name, spec, clock.now(), declared=False, namespace=namespace)


def pause_schedule(key: str) -> bool:
    """Stop ticking; False if it was already paused."""
    return bool(_rows(key).pause(key, clock.now()))


def resume_schedule(key: str) -> bool:
    """Tick again from now on (ticks missed while paused never run); False if it was not paused."""
    from .engine import schedules

    row = _rows(key).get(key=key)
    try:
        next_at = schedules.next_tick(row.cron, row.timezone, clock.now())
    except ValueError:  # a cron stored before crons that never fire were refused
        raise InvalidInput(
            f"schedule {key!r} has cron {row.cron!r}, which never fires; redefine it with durable.schedule()"
        ) from None
    return bool(_rows(key).resume(key, next_at, clock.now()))


def trigger_schedule(key: str) -> RunHandle:
    """Start a run of the schedule now, as a tick at this moment would (its next tick stays)."""
    from .engine import runs, schedules

    row = _rows(key).get(key=key)
    return RunHandle(
        runs.start(
            row.workflow,
            decode(row.input),
            run_id=schedules.run_id(key, clock.now()),
            namespace=row.namespace,
        )
    )


def _check_key(key: Any) -> None:
    guards.text(key, "schedule key", max_length=column_length("CronSchedule", "key"))


def _rows(key: str) -> Any:
    from .models import CronSchedule

    _check_key(key)
    rows = CronSchedule.objects.using(conf.get().DATABASE)
    if not rows.filter(key=key).exists():
        raise InvalidInput(f"no schedule has the key {key!r}; create it with durable.schedule()")
    return rows
