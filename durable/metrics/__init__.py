"""Metrics of runs, turns and step attempts: OpenTelemetry instruments and their Prometheus twin.

A value is first added to this process's own tallies (a dict entry and a bucket: about a
microsecond, under a lock), and read from there by whoever collects:

- the OpenTelemetry meter of the global provider, once the project configured an SDK one (the
  API's default records nothing, so nothing is made for it): counters are observable counters of
  the tallies; histogram values wait in a bounded buffer and are recorded into the SDK's
  histograms when its reader collects (the SDK's own cost per value, tens of microseconds, is
  paid then, off the turn); gauges are read from the database (``durable.metrics.gauges``);
- ``durable.metrics_view`` (``prometheus-client`` renders the text): the tallies of this process,
  or, with ``DURABLE["METRICS_DIR"]``, those every process of the host writes there (a flusher
  thread writes this process's file within a second of a change; ``durable.metrics.shared``).

Names, kinds and attributes: the table of ``durable.metrics.instruments``. The engine asks for a
recorder (``run_started``, ``run_ended``, ``step_ended``) and calls it once the change commits:
a rolled-back transition never counts. Nothing records unless an SDK provider is set or
prometheus-client is installed; then each costs a check.
"""

from __future__ import annotations

import functools
import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from . import shared
from .instruments import BUCKETS, BY_NAME, COUNTER, HISTOGRAM, INSTRUMENTS

try:  # optional: durable never requires OpenTelemetry
    from opentelemetry import metrics as otel
except ImportError:  # pragma: no cover - exercised only where the package is absent
    otel = None  # type: ignore[assignment]

try:  # optional: the Prometheus text of durable.metrics_view
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only where the package is absent
    prometheus_client = None  # type: ignore[assignment]

log = logging.getLogger("durable.metrics")

Recorder = Callable[[], None]
#: (instrument name, attribute values in the table's order)
Key = tuple[str, tuple[str, ...]]
#: (instrument name, value, attribute values in the table's order)
Value = tuple[str, float, tuple[str, ...]]

_COUNTERS = frozenset(instrument.name for instrument in INSTRUMENTS if instrument.kind == COUNTER)
#: Histogram values waiting for the SDK's collection; past this many, new ones are dropped for
#: OpenTelemetry (a provider whose reader never collects must not grow the process without end).
PENDING_LIMIT = 100_000

_lock = threading.Lock()
#: This process's tallies: a counter's total; a histogram's per-bucket counts (the last: above
#: every bound), sum and count.
counters: dict[Key, float] = {}
histograms: dict[Key, list[Any]] = {}
#: Bumped at each change: the flusher writes the process's file when it moved.
changes = 0

#: The provider the OpenTelemetry instruments were made with, and the histograms among them.
_provider: Any = None
_otel_histograms: dict[str, Any] = {}
_pending: list[Value] = []
_dropped = 0


def _otel_on() -> bool:
    """Whether an SDK meter provider takes values; makes the instruments again when the project
    set another provider. False while the global provider is the API's own (proxy or no-op)."""
    global _provider, _otel_histograms
    if otel is None:
        return False
    provider = otel.get_meter_provider()
    if provider is not _provider:
        _provider, _otel_histograms = provider, {}
        if not type(provider).__module__.startswith("opentelemetry.metrics"):
            try:
                _otel_histograms = _make_otel(provider)
            except Exception:  # noqa: BLE001 - an SDK too old or broken: no metrics, never a failed turn
                log.exception("durable: could not make the OpenTelemetry instruments")
    return bool(_otel_histograms)


def _make_otel(provider: Any) -> dict[str, Any]:
    from . import gauges

    meter = provider.get_meter("durable")
    made: dict[str, Any] = {}
    for instrument in INSTRUMENTS:
        common = {"name": instrument.name, "unit": instrument.unit, "description": instrument.description}
        if instrument.kind == COUNTER:
            meter.create_observable_counter(
                **common, callbacks=[functools.partial(_observe_counter, instrument.name)]
            )
        elif instrument.kind == HISTOGRAM:
            made[instrument.name] = meter.create_histogram(
                **common, explicit_bucket_boundaries_advisory=list(BUCKETS)
            )
        else:
            meter.create_observable_gauge(**common, callbacks=[gauges.otel_callback(instrument.name)])
    return made


def _observe_counter(name: str, options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    # The SDK runs every callback before it collects its histograms: hand them the waiting values.
    _drain()
    names = BY_NAME[name].attributes
    with _lock:
        found = [(values, total) for (kind, values), total in counters.items() if kind == name]
    return [Observation(total, dict(zip(names, values, strict=True))) for values, total in found]


def _drain() -> None:
    global _pending, _dropped
    with _lock:
        taken, _pending = _pending, []
        dropped, _dropped = _dropped, 0
    if dropped:
        log.warning(
            "durable: %d histogram values were dropped for OpenTelemetry: its reader collects too seldom",
            dropped,
        )
    histograms_made = _otel_histograms
    for name, value, values in taken:
        histogram = histograms_made.get(name)
        if histogram is not None:
            histogram.record(value, dict(zip(BY_NAME[name].attributes, values, strict=True)))


def make() -> None:
    """Make the OpenTelemetry instruments now, if the project set an SDK provider: its gauges are
    then observed from the first collection, before anything is recorded (called at Django's
    ready and at each worker's start; any record makes them too)."""
    try:
        _otel_on()
    except Exception:  # noqa: BLE001 - never worth a worker's start
        log.exception("durable: could not make the OpenTelemetry instruments")


def enabled() -> bool:
    """Whether anything takes metrics here: prometheus-client, or an SDK meter provider."""
    return prometheus_client is not None or _otel_on()


def _record(values: list[Value]) -> None:
    """Add each (instrument, value, attribute values) to the tallies; never raises into the engine
    (the change it reports is committed)."""
    global changes, _dropped
    try:
        buffering = _otel_on()
        with _lock:
            for name, value, attributes in values:
                key = (name, attributes)
                if name in _COUNTERS:
                    counters[key] = counters.get(key, 0.0) + value
                    continue
                tally = histograms.get(key)
                if tally is None:
                    tally = histograms[key] = [[0] * (len(BUCKETS) + 1), 0.0, 0]
                tally[0][bisect_left(BUCKETS, value)] += 1
                tally[1] += value
                tally[2] += 1
                if buffering:
                    if len(_pending) < PENDING_LIMIT:
                        _pending.append((name, value, attributes))
                    else:
                        _dropped += 1
            changes += 1
        shared.changed()
    except Exception:  # noqa: BLE001 - a metric is never worth a turn
        log.exception("durable: could not record metrics %s", [name for name, *_ in values])


def _later(values: list[Value]) -> Recorder | None:
    return functools.partial(_record, values) if enabled() else None


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else max(delta.total_seconds(), 0.0)


def run_started(workflow: str, namespace: str | None) -> Recorder | None:
    """The recorder of a run's first turn (None: nothing records)."""
    return _later([("durable.runs.started", 1.0, (workflow, namespace or ""))])


def run_ended(
    status: str, workflow: str, namespace: str | None, duration: timedelta | None
) -> Recorder | None:
    """The recorder of a run that reached ``status`` (completed, failed, cancelled or dead)."""
    run = (workflow, namespace or "")
    values: list[Value] = [(f"durable.runs.{status}", 1.0, run)]
    seconds = _seconds(duration)
    if seconds is not None:
        values.append(("durable.run.duration", seconds, (*run, str(status))))
    return _later(values)


def step_ended(
    step: str,
    queue: str | None,
    namespace: str | None,
    outcome: str,
    queue_wait: timedelta | None,
    duration: timedelta | None,
) -> Recorder | None:
    """The recorder of a step attempt that ended: ``outcome`` completed, retried or failed."""
    where = (step, queue or "", namespace or "")
    values: list[Value] = [("durable.steps.attempts", 1.0, (*where, outcome))]
    seconds = _seconds(duration)
    if seconds is not None:
        values.append(("durable.step.duration", seconds, (*where, outcome)))
    waited = _seconds(queue_wait)
    if waited is not None:
        values.append(("durable.step.queue_wait", waited, where))
    return _later(values)


def turn_ended(workflow: str, namespace: str | None, outcome: str, seconds: float) -> None:
    """A turn of a run settled with ``outcome`` after ``seconds`` (its transactions are over)."""
    if enabled():
        _record([("durable.turn.duration", max(seconds, 0.0), (workflow, namespace or "", outcome))])


def snapshot() -> dict[str, Any]:
    """This process's tallies, as plain JSON."""
    with _lock:
        return {
            "buckets": list(BUCKETS),
            "counters": [[name, list(values), total] for (name, values), total in counters.items()],
            "histograms": [
                [name, list(values), list(tally[0]), tally[1], tally[2]]
                for (name, values), tally in histograms.items()
            ],
        }
