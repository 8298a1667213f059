"""The Grafana dashboard of docs/grafana/durable.json: it parses as a dashboard, and every query
names only metrics durable exposes, under their Prometheus names."""

from __future__ import annotations

import json
import re
from pathlib import Path

from durable.metrics.instruments import COUNTER, HISTOGRAM, INSTRUMENTS

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "durable.json"
METRIC = re.compile(r"\bdurable_[a-z_]+\b")


def exposed() -> set[str]:
    """The sample names of durable.metrics_view: dots become underscores, a counter adds
    ``_total``, a histogram is ``_bucket`` / ``_sum`` / ``_count``, a gauge is itself."""
    names = set()
    for instrument in INSTRUMENTS:
        base = instrument.prometheus
        if instrument.kind == COUNTER:
            names.add(f"{base}_total")
        elif instrument.kind == HISTOGRAM:
            names |= {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
        else:
            names.add(base)
    return names


def queries(dashboard: dict) -> list[str]:
    found = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    found += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return found


def test_the_dashboard_parses_with_the_fields_grafana_needs() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["type"] in ("timeseries", "stat", "gauge", "table") and panel["title"]
        assert (
            set(panel["gridPos"]) == {"x", "y", "w", "h"}
            and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        )
        assert panel["targets"] and all(t["refId"] and t["expr"] for t in panel["targets"])


def test_every_query_names_metrics_durable_exposes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = exposed()
    for query in queries(dashboard):
        named = METRIC.findall(query)
        assert named, f"names no durable metric: {query}"
        assert set(named) <= known, f"{query} names {sorted(set(named) - known)}, not among {sorted(known)}"


def test_the_dashboard_shows_runs_steps_timers_and_sweep_lag() -> None:
    named = {name for query in queries(json.loads(DASHBOARD.read_text())) for name in METRIC.findall(query)}
    assert {
        "durable_runs_completed_total",
        "durable_runs_failed_total",
        "durable_step_duration_bucket",
        "durable_step_queue_wait_bucket",
        "durable_timers_due",
        "durable_timers_oldest_due_age",
        "durable_steps_oldest_unstarted_age",
    } <= named
