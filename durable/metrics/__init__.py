"""OpenTelemetry metrics, and their Prometheus twin, for runs, turns and step attempts.

Every value goes to two places, each only when it is there to take it: the instruments of the
global OpenTelemetry meter provider, once the project configured an SDK one (the API's default
records nothing, so nothing is built for it), and ``prometheus_client``'s, when that package is
installed (the ``prometheus`` extra), which ``durable.metrics_view`` serves. The names, kinds and
attributes are the table of ``durable.metrics.instruments``; the gauges are read from the
database when collected (``durable.metrics.gauges``).

The engine asks for a recorder (``run_started``, ``run_ended``, ``step_ended``) and calls it once
the change commits: a rolled-back transition never counts. With neither sink, each costs a check.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .instruments import BUCKETS, COUNTER, GAUGE, HISTOGRAM, INSTRUMENTS

try:  # optional: durable never requires OpenTelemetry
    from opentelemetry import metrics as otel
except ImportError:  # pragma: no cover - exercised only where the package is absent
    otel = None  # type: ignore[assignment]

try:  # optional: the Prometheus text of durable.metrics_view
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only where the package is absent
    prometheus_client = None  # type: ignore[assignment]

log = logging.getLogger("durable.metrics")

_COUNTERS = frozenset(instrument.name for instrument in INSTRUMENTS if instrument.kind == COUNTER)

Recorder = Callable[[], None]

#: The provider the OpenTelemetry instruments were made with, and those instruments by name.
_provider: Any = None
_otel: dict[str, Any] = {}
#: prometheus_client's instruments by name, made once per process (in their own registry).
_prometheus: dict[str, Any] | None = None
REGISTRY: Any = None


def _otel_instruments() -> dict[str, Any] | None:
    """The meter's instruments, made again when the project set another provider; None while the
    global provider is the API's own (a proxy or no-op: no SDK configured)."""
    global _provider, _otel
    if otel is None:
        return None
    provider = otel.get_meter_provider()
    if provider is _provider:
        return _otel or None
    _provider, _otel = provider, {}
    if not type(provider).__module__.startswith("opentelemetry.metrics"):
        try:
            _otel = _make_otel(provider)
        except Exception:  # noqa: BLE001 - an SDK too old or broken: no metrics, never a failed turn
            log.exception("durable: could not make the OpenTelemetry instruments")
    return _otel or None


def _make_otel(provider: Any) -> dict[str, Any]:
    from . import gauges

    meter = provider.get_meter("durable")
    made: dict[str, Any] = {}
    for instrument in INSTRUMENTS:
        common = {"name": instrument.name, "unit": instrument.unit, "description": instrument.description}
        if instrument.kind == COUNTER:
            made[instrument.name] = meter.create_counter(**common)
        elif instrument.kind == HISTOGRAM:
            made[instrument.name] = meter.create_histogram(
                **common, explicit_bucket_boundaries_advisory=list(BUCKETS)
            )
        else:
            made[instrument.name] = meter.create_observable_gauge(
                **common, callbacks=[gauges.otel_callback(instrument.name)]
            )
    return made


def _prometheus_instruments() -> dict[str, Any] | None:
    global _prometheus, REGISTRY
    if prometheus_client is None:
        return None
    if _prometheus is None:
        # A registry of durable's own: nothing of the project's default one is touched.
        REGISTRY = prometheus_client.CollectorRegistry()
        made: dict[str, Any] = {}
        for instrument in INSTRUMENTS:
            if instrument.kind == GAUGE:
                continue  # read from the database by the view (durable.metrics.gauges)
            named = (instrument.prometheus, instrument.description)
            made[instrument.name] = (
                prometheus_client.Counter(*named, labelnames=instrument.attributes, registry=REGISTRY)
                if instrument.kind == COUNTER
                else prometheus_client.Histogram(
                    *named, labelnames=instrument.attributes, registry=REGISTRY, buckets=BUCKETS
                )
            )
        _prometheus = made
    return _prometheus


def make() -> None:
    """Make the OpenTelemetry instruments now, if the project set an SDK provider: its gauges are
    then observed from the first collection, before anything is recorded (called at Django's
    ready and at each worker's start; any record makes them too)."""
    try:
        _otel_instruments()
    except Exception:  # noqa: BLE001 - never worth a worker's start
        log.exception("durable: could not make the OpenTelemetry instruments")


def enabled() -> bool:
    """Whether anything records metrics here: an SDK meter provider, or prometheus_client."""
    return prometheus_client is not None or _otel_instruments() is not None


def _record(values: list[tuple[str, float, dict[str, str]]]) -> None:
    """Add each (instrument, value, attributes) to each sink; a sink that fails is logged, never
    raised into the engine (the change it reports is committed)."""
    try:
        made = _otel_instruments()
        if made is not None:
            for name, value, attributes in values:
                if name in _COUNTERS:
                    made[name].add(value, attributes)
                else:
                    made[name].record(value, attributes)
        kept = _prometheus_instruments()
        if kept is not None:
            for name, value, attributes in values:
                child = kept[name].labels(**attributes)
                if name in _COUNTERS:
                    child.inc(value)
                else:
                    child.observe(value)
    except Exception:  # noqa: BLE001 - a metric is never worth a turn
        log.exception("durable: could not record metrics %s", [name for name, *_ in values])


def _later(values: list[tuple[str, float, dict[str, str]]]) -> Recorder | None:
    return functools.partial(_record, values) if enabled() else None


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else max(delta.total_seconds(), 0.0)


def run_started(workflow: str, namespace: str | None) -> Recorder | None:
    """The recorder of a run's first turn (None: nothing records)."""
    return _later([("durable.runs.started", 1, {"workflow": workflow, "namespace": namespace or ""})])


def run_ended(
    status: str, workflow: str, namespace: str | None, duration: timedelta | None
) -> Recorder | None:
    """The recorder of a run that reached ``status`` (completed, failed, cancelled or dead)."""
    attributes = {"workflow": workflow, "namespace": namespace or ""}
    values = [(f"durable.runs.{status}", 1.0, attributes)]
    seconds = _seconds(duration)
    if seconds is not None:
        values.append(("durable.run.duration", seconds, {**attributes, "status": status}))
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
    attributes = {"step": step, "queue": queue or "", "namespace": namespace or ""}
    values = [("durable.steps.attempts", 1.0, {**attributes, "outcome": outcome})]
    seconds = _seconds(duration)
    if seconds is not None:
        values.append(("durable.step.duration", seconds, {**attributes, "outcome": outcome}))
    waited = _seconds(queue_wait)
    if waited is not None:
        values.append(("durable.step.queue_wait", waited, attributes))
    return _later(values)


def turn_ended(workflow: str, namespace: str | None, outcome: str, seconds: float) -> None:
    """A turn of a run settled with ``outcome`` after ``seconds`` (its transactions are over)."""
    if enabled():
        attributes = {"workflow": workflow, "namespace": namespace or "", "outcome": outcome}
        _record([("durable.turn.duration", max(seconds, 0.0), attributes)])
