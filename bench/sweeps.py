"""Family 4: the beat sweeps on a backlog, timed in this process with the Celery sender swapped
for a counter, so what is timed is the sweep, not the broker.

- timers: ``count`` suspended runs whose ``wake_at`` is past; ``sweep_timers()`` until every
  one was sent a turn.
- orphans: ``count`` running runs whose lease expired; ``sweep_orphans()`` until every one was
  recovered.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import timedelta

from bench.env import truncate
from bench.stats import Reps, summary

GOALS_S = {"timers": 10.0, "orphans": 20.0}


def _insert(count: int, orphans: bool) -> None:
    from django.utils import timezone

    from durable.models import Run

    now = timezone.now()
    past = now - timedelta(minutes=5)
    fields = (
        {
            "status": "running",
            "locked_by": "bench-dead-host:1/0",
            "locked_until": past,
            "wake_at": now + timedelta(minutes=5),
        }
        if orphans
        else {"status": "suspended", "wake_at": past}
    )
    rows = [
        Run(
            id=uuid.uuid4().hex,
            workflow="bench.parked",
            version="1",
            queue="durable",
            input=None,
            created_at=past,
            updated_at=past,
            started_at=past,
            **fields,
        )
        for _ in range(count)
    ]
    Run.objects.bulk_create(rows, batch_size=2000)


def _time(sweep, count: int) -> dict[str, float]:
    from durable import dispatch

    sent: list[object] = []
    saved = dispatch.install(replace(dispatch.transport, send=sent.append))
    try:
        found, passes, t0 = 0, 0, time.perf_counter()
        # A message may wake many runs (``durable.advance_batch``): count the runs.
        while sum(len(dispatch.woken(message)) for message in sent) < count:
            found += sweep()
            passes += 1
            if passes > 10 * count:
                raise RuntimeError(f"{sweep.__name__} found {found} of {count}")
        elapsed = time.perf_counter() - t0
    finally:
        dispatch.install(saved)
    return {
        "seconds": elapsed,
        "passes": passes,
        "sent": sum(len(dispatch.woken(message)) for message in sent),
        "messages": len(sent),
    }


def run(count: int, planned: int, budget: float | None = None) -> dict:
    from durable.engine import sweeps

    kinds = {"timers": sweeps.sweep_timers, "orphans": sweeps.sweep_orphans}
    samples: dict[str, list] = {name: [] for name in kinds}
    reps = Reps(planned, budget)
    for _ in reps:
        for name, sweep in kinds.items():
            truncate()
            _insert(count, orphans=name == "orphans")
            samples[name].append(_time(sweep, count))
    out: dict = {"reps": reps.info()}
    for name in kinds:
        seconds = summary([s["seconds"] for s in samples[name]], 3)
        out[name] = {
            "count": count,
            "seconds": seconds,
            "passes": samples[name][0]["passes"],
            "runs_per_s": round(count / seconds["median"], 1),
            "goal_s_for_10k": GOALS_S[name],
            # The goal is for 10,000 rows; a quick run with fewer is scaled linearly.
            "projected_10k_s": round(seconds["median"] * 10_000 / count, 3),
        }
    truncate()
    return out
