"""Reading durable's metrics back in tests: an OpenTelemetry SDK in-memory reader's data, and
Prometheus text, as plain {name: [(attributes, value)]} to compare."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Points = dict[str, list[tuple[dict[str, str], Any]]]


def otel_points(data: Any) -> Points:
    """Each data point by instrument name: a counter's or gauge's value, a histogram's count."""
    found: Points = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = point.count if hasattr(point, "bucket_counts") else point.value
                    found.setdefault(metric.name, []).append((dict(point.attributes), value))
    return found


def prometheus_samples(text: str) -> Points:
    """Each sample of Prometheus text by sample name (``..._total``, ``..._count``, a gauge's own)."""
    found: Points = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def value(points: Points, name: str, **attributes: str) -> float:
    """The sum of ``name``'s points whose attributes include ``attributes`` (0 when none)."""
    return sum(v for attrs, v in points.get(name, []) if attributes.items() <= attrs.items())
