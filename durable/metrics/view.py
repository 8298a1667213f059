"""``durable.metrics_view``: the metrics as Prometheus text, for ``path("metrics/", ...)``.

Allowed to a scraper that sends ``Authorization: Bearer <DURABLE["METRICS_TOKEN"]>`` and to a
signed-in active staff user; refused to anyone else, with a reason (401 when a token is set, 403
when none is). Counters and histograms: with ``DURABLE["METRICS_DIR"]`` set on every process of
the host (web and workers), the sum of every process that wrote there (``durable.metrics.shared``);
without it, only this process's own. Gauges are read from the database at each scrape
(``durable.metrics.gauges``), the same whichever process serves the view. ``prometheus-client``
renders the text.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from .. import conf, metrics
from . import shared
from .instruments import BUCKETS, COUNTER, GAUGE, INSTRUMENTS


class _Gauges:
    """The gauges, read when the registry is collected."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from . import gauges  # the rows: not at ``import durable``, before Django is set up

        for instrument in INSTRUMENTS:
            if instrument.kind != GAUGE:
                continue
            family = GaugeMetricFamily(
                instrument.prometheus, instrument.description, labels=list(instrument.attributes)
            )
            for attributes, value in gauges.read(instrument.name):
                family.add_metric([attributes[key] for key in instrument.attributes], value)
            yield family


class _Tallies:
    """The counters and histograms: this process's, or the sum of the host's."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        if self.directory:
            shared.flush()  # this process's own values too
            counters, histograms = shared.read(self.directory)
        else:
            with metrics._lock:
                counters = dict(metrics.counters)
                histograms = {key: [list(t[0]), t[1], t[2]] for key, t in metrics.histograms.items()}
        bounds = [str(bound) for bound in BUCKETS] + ["+Inf"]
        for instrument in INSTRUMENTS:
            labels = list(instrument.attributes)
            if instrument.kind == GAUGE:
                continue
            if instrument.kind == COUNTER:
                family: Any = CounterMetricFamily(
                    instrument.prometheus, instrument.description, labels=labels
                )
                for (name, values), total in sorted(counters.items()):
                    if name == instrument.name:
                        family.add_metric(list(values), total)
            else:
                family = HistogramMetricFamily(instrument.prometheus, instrument.description, labels=labels)
                for (name, values), (counts, total, _count) in sorted(histograms.items()):
                    if name == instrument.name:
                        cumulative, running = [], 0
                        for bound, count in zip(bounds, counts, strict=True):
                            running += count
                            cumulative.append((bound, running))
                        family.add_metric(list(values), cumulative, total)
            yield family


def refusal(request: HttpRequest) -> HttpResponse | None:
    """Why ``request`` may not read the metrics, as the response to send; None when it may."""
    token = conf.get().METRICS_TOKEN
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode()):
        return None
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return None
    if token:
        refused = HttpResponse(
            "durable metrics: send Authorization: Bearer <DURABLE['METRICS_TOKEN']>, or sign in as staff\n",
            status=401,
            content_type="text/plain",
        )
        refused["WWW-Authenticate"] = 'Bearer realm="durable metrics"'
        return refused
    return HttpResponse(
        "durable metrics: only staff may read them; set DURABLE['METRICS_TOKEN'] for a scraper\n",
        status=403,
        content_type="text/plain",
    )


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics of ``durable.metrics`` in Prometheus' text format (see the module's doc)."""
    refused = refusal(request)
    if refused is not None:
        return refused
    if metrics.prometheus_client is None:
        return HttpResponse(
            "durable metrics: prometheus-client is not installed (pip install 'durable[prometheus]')\n",
            status=501,
            content_type="text/plain",
        )
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(_Tallies(conf.get().METRICS_DIR))
    registry.register(_Gauges())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
