"""How a bench process records durable's metrics (``durable.metrics``), whatever its venv holds:

- ``off``: neither sink, as a project without prometheus-client and without an SDK meter provider;
- ``prometheus``: prometheus-client's instruments only (what ``durable.metrics_view`` serves);
- ``otel``: an OpenTelemetry SDK meter provider only (its reader never collects here: the values
  aggregate in memory, as between two exports of a periodic reader);
- ``both``: the two, the most a run can pay.
"""

from __future__ import annotations

from collections.abc import Callable

MODES = ("off", "prometheus", "otel", "both")


def apply(mode: str) -> Callable[[], None]:
    """Set this process's metrics up as ``mode`` says; return what undoes it."""
    if mode not in MODES:
        raise ValueError(f"metrics mode must be one of {', '.join(MODES)}, got {mode!r}")
    from durable import metrics

    undo: list[Callable[[], None]] = []
    if mode in ("off", "otel"):
        kept = metrics.prometheus_client
        metrics.prometheus_client = None  # as if the package were not installed
        undo.append(lambda: setattr(metrics, "prometheus_client", kept))
    elif metrics.prometheus_client is None:
        raise RuntimeError("prometheus-client is not installed in this venv")
    if mode in ("otel", "both"):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        get = metrics.otel.get_meter_provider
        metrics.otel.get_meter_provider = lambda: provider  # type: ignore[assignment]
        undo.append(lambda: setattr(metrics.otel, "get_meter_provider", get))
        undo.append(provider.shutdown)
    metrics.make()

    def undo_all() -> None:
        for step in reversed(undo):
            step()
        metrics.make()

    return undo_all
