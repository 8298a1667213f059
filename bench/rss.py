"""Family 6: the durable worker's peak RSS after ``first`` and after ``last`` completed runs.

A fresh worker (same settings as the others) runs ``bench.local10`` in batches of ``first``;
its process tree's peak RSS (VmHWM of the parent and each pool child) is read after the first
batch and after the last. Flat means the ratio stays within 10%.
"""

from __future__ import annotations

from bench import dispatched
from bench.env import Worker
from bench.stats import ratio

WORKFLOW = "bench.local10"
GOAL_MAX_GROWTH = 0.10


def run(first: int, last: int) -> dict:
    worker = Worker("rss").start()
    try:
        done, points = 0, {}
        while done < last:
            dispatched.durable_many(WORKFLOW, first)
            done += first
            if done in (first, last):
                points[done] = worker.rss()
    finally:
        worker.stop()
    a, b = points[first], points[last]
    return {
        "workflow": WORKFLOW,
        "after_runs": {str(k): v for k, v in points.items()},
        "ratio_peak_total": ratio(b["peak_total_mib"], a["peak_total_mib"], 3),
        "ratio_peak_max_child": ratio(b["peak_max_child_mib"], a["peak_max_child_mib"], 3),
        "goal_max_ratio": 1 + GOAL_MAX_GROWTH,
    }
