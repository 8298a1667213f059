"""``durable.metrics_view``: the metrics as Prometheus text, for ``path("metrics/", ...)``.

Allowed to a scraper that sends ``Authorization: Bearer <DURABLE["METRICS_TOKEN"]>`` and to a
signed-in active staff user; refused to anyone else, with a reason (401 when a token is set, 403
when none is). Counters and histograms come from ``prometheus_client``: with
``PROMETHEUS_MULTIPROC_DIR`` set on every process of the host (web and workers), those of every
process that wrote there; without it, only this process's own. Gauges are read from the database
at each scrape (``durable.metrics.gauges``), the same whichever process serves the view.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from .. import conf, metrics
from .instruments import GAUGE, INSTRUMENTS


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


class _ThisProcess:
    """durable's counters and histograms as this process holds them."""

    def collect(self) -> Iterator[Any]:
        metrics._prometheus_instruments()
        yield from metrics.REGISTRY.collect()


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
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        MultiProcessCollector(registry, path=directory)
    else:
        registry.register(_ThisProcess())  # type: ignore[arg-type]
    registry.register(_Gauges())  # type: ignore[arg-type]
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
