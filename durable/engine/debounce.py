"""``durable.debounce``: a burst of calls for one key starts one run, with the last call's input,
once ``period`` passed without another call (``max_wait`` after the first call at the latest).

The run exists from the first call: pending and not admitted (``models.debounced``), so its id is
what every call of the burst returns, a signal sent to it waits for it, and an operator sees it
in the admin. Each call gathers into it under its row lock; the timer pass admits it once due.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction

from .. import clock, conf, guards
from ..definitions import Workflow
from ..durations import parse_duration
from ..models import Run, RunQuerySet, column_length
from . import runs


def debounce(workflow: Workflow | str, input: Any, *, key: Any, period: Any, max_wait: Any) -> str:
    """Gather this call into the run waiting for ``key`` or begin one; return the run's id."""
    settings = conf.get()
    definition = runs.startable(workflow, None)
    if definition.singleton is not None or definition.lane is not None:
        raise guards.refuse(
            "workflow",
            f"{definition.name!r} waits in a line of its own (singleton=, concurrency= or lane=), "
            "which debounce() does not take yet: debounce a workflow without one, or start() this one",
        )
    key = guards.text(key, "key", max_length=column_length("Run", "debounce_key"))
    quiet = _duration(period, "period")
    longest = None if max_wait is None else _duration(max_wait, "max_wait")
    if longest is not None and longest < quiet:
        raise guards.refuse("max_wait", f"({longest}) must be at least period ({quiet})")
    stored_input = runs.checked_input(definition, input, settings.MAX_PAYLOAD_BYTES)
    namespace = settings.NAMESPACE or ""
    with transaction.atomic(using=settings.DATABASE):
        waiting = _runs().gathering(namespace, definition.name, key)
        if waiting is None:
            return runs.create(definition, stored_input, delay=quiet, admitted=False, debounce_key=key)
        now = clock.now()
        start_at = now + quiet
        if longest is not None:
            start_at = min(start_at, waiting.created_at + longest)
        deadline = start_at + definition.timeout if definition.timeout else None
        _runs().put_off(waiting.id, stored_input, start_at, deadline, now)
        return str(waiting.id)


def admit_due() -> int:
    """Admit the debounced runs whose start is due (the timer pass then sends their first turn)."""
    settings = conf.get()
    return _runs().serving(settings.NAMESPACE).admit_debounced(clock.now(), settings.TIMER_BATCH_SIZE)


def _duration(value: Any, field: str) -> timedelta:
    try:
        parsed = parse_duration(value, what=field)
    except ValueError as exc:
        raise guards.refuse(field, str(exc).removeprefix(f"{field}: ")) from None
    if parsed <= timedelta(0):
        raise guards.refuse(field, f"must be longer than zero, got {value!r}")
    return parsed


def _runs() -> RunQuerySet:
    return Run.objects.using(conf.get().DATABASE)
