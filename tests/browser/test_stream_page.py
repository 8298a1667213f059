"""The example project's tracking page in a real headless Chromium: it lists a run's stream
values as the run writes them (server-sent events from the sync view under the live WSGI server),
then says the stream is closed. A PNG of the page is saved with each state."""

from __future__ import annotations

from typing import Any

import durable
from durable.testing import wait_for
from project.shop.workflows import STAGES, track

from .conftest import Page


def test_the_tracking_page_shows_a_runs_stream_live(page: Page, engine: Any) -> None:
    run = durable.start(track, 7)
    engine.run_until_idle()  # the first scan, then the parcel travels (a one-second sleep)
    page.open(f"/shop/track/{run.id}/?sync=1")
    wait_for(lambda: len(page.all("#events li")) == 1, 20, what="the first scan on the page")
    first = page.text("#events")
    page.shot("first-value")

    def scanned() -> bool:
        engine.sweep()  # a timer due fires; the next scan runs and is on the stream at once
        return "closed" in page.text("#state")

    wait_for(scanned, 30, interval=0.2, what="every scan and the stream's end on the page")
    page.shot("closed")
    assert first == "picked"
    assert page.text("#events").splitlines() == [*STAGES, f"done: {len(STAGES)} scans"]
    assert durable.result(run.id) == [f"7:{stage}" for stage in STAGES]
