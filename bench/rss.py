"""Family 6: the durable worker's peak RSS after ``first`` and after ``last`` completed runs.

A fresh worker (same settings as the others) runs ``bench.local1`` (one turn, one local step:
the cheapest run that still goes through a turn, a step and a commit) in batches of ``first``;
its process tree's peak RSS (VmHWM of the parent and of each pool child) is read after the first
batch and after the last. Flat means the ratio stays within 10%.
"""

from __future__ import annotations

from bench import dispatched
from bench.env import Worker
from bench.stats import Reps, ratio

WORKFLOW = "bench.local1"
GOAL_MAX_GROWTH = 0.10


def run(first: int, last: int, budget: float | None = None) -> dict:
    worker = Worker("rss").start()
    batches = Reps(last // first, budget)
    try:
        done, points = 0, {}
        for _ in batches:
            dispatched.durable_many(WORKFLOW, first)
            done += first
            if done == first:
                points[done] = worker.rss()
        points[done] = worker.rss()
    finally:
        worker.stop()
    a, b = points[first], points[done]
    return {
        "workflow": WORKFLOW,
        "batches": batches.info(),
        "after_runs": {str(k): v for k, v in points.items()},
        "ratio_peak_total": ratio(b["peak_total_mib"], a["peak_total_mib"], 3),
        "ratio_peak_max_child": ratio(b["peak_max_child_mib"], a["peak_max_child_mib"], 3),
        "goal_max_ratio": 1 + GOAL_MAX_GROWTH,
    }
