"""The gauges of ``durable.metrics``, read from the database when a reader collects them (an
OpenTelemetry reader's collection, a scrape of ``durable.metrics_view``), never on a turn.

Each is one statement on an index: the timers from ``durable_run_due`` (status, wake_at), the
runs waiting for their first turn from its status prefix, the unstarted step attempts from the
partial ``durable_checkpoint_untaken`` (only attempts sent and not taken are in it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db.models import Count, Min

from .. import clock, conf
from ..models import Checkpoint, Run
from ..statuses import CheckpointStatus, RunStatus

log = logging.getLogger("durable.metrics")

Reading = list[tuple[dict[str, str], float]]

#: The timer gauges share one statement: the first read of a collection (their order in the
#: table) keeps the lag for the second, which takes it, if still fresh, or reads again.
_FRESH_FOR = 1.0
_lag: tuple[float, Reading] | None = None


def _namespace() -> tuple[str | None, str]:
    namespace = conf.get().NAMESPACE
    return namespace, namespace or ""


def _timer_readings() -> tuple[Reading, Reading]:
    settings = conf.get()
    namespace, label = _namespace()
    now = clock.now()
    found = (
        Run.objects.using(settings.DATABASE)
        .serving(namespace)
        .filter(status=RunStatus.SUSPENDED, wake_at__lte=now)
        .aggregate(due=Count("id"), oldest=Min("wake_at"))
    )
    oldest = found["oldest"]
    due = [({"namespace": label}, float(found["due"]))]
    lag = [({"namespace": label}, max((now - oldest).total_seconds(), 0.0) if oldest else 0.0)]
    return due, lag


def timers_due() -> Reading:
    global _lag
    due, lag = _timer_readings()
    _lag = (time.monotonic(), lag)
    return due


def timers_oldest_due_age() -> Reading:
    global _lag
    kept, _lag = _lag, None
    if kept is not None and time.monotonic() - kept[0] < _FRESH_FOR:
        return kept[1]
    return _timer_readings()[1]


def runs_waiting_first_turn() -> Reading:
    settings = conf.get()
    namespace, label = _namespace()
    count = Run.objects.using(settings.DATABASE).serving(namespace).filter(status=RunStatus.PENDING).count()
    return [({"namespace": label}, float(count))]


def steps_oldest_unstarted_age() -> Reading:
    settings = conf.get()
    namespace, label = _namespace()
    now = clock.now()
    # The condition of the partial index durable_checkpoint_untaken, word for word.
    rows = (
        Checkpoint.objects.using(settings.DATABASE)
        .serving(namespace)
        .filter(
            kind="step", status=CheckpointStatus.PENDING, started_at__isnull=True, enqueued_at__isnull=False
        )
        .values("queue")
        .annotate(oldest=Min("enqueued_at"))
        .order_by()
    )
    return [
        ({"queue": row["queue"], "namespace": label}, max((now - row["oldest"]).total_seconds(), 0.0))
        for row in rows
    ]


READERS: dict[str, Callable[[], Reading]] = {
    "durable.timers.due": timers_due,
    "durable.timers.oldest_due_age": timers_oldest_due_age,
    "durable.runs.waiting_first_turn": runs_waiting_first_turn,
    "durable.steps.oldest_unstarted_age": steps_oldest_unstarted_age,
}


def read(name: str) -> Reading:
    """The gauge ``name`` now; nothing (logged) when the database cannot say."""
    try:
        return READERS[name]()
    except Exception:  # noqa: BLE001 - a reader's collection goes on without this gauge
        log.warning("durable: could not read the gauge %s", name, exc_info=True)
        return []


def otel_callback(name: str) -> Callable[[Any], Iterable[Any]]:
    """The callback of the observable gauge ``name``."""
    from opentelemetry.metrics import Observation

    def observe(options: Any) -> Iterable[Any]:
        return [Observation(value, attributes) for attributes, value in read(name)]

    return observe
