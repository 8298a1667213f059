"""Repetition and summary helpers shared by the benchmark families."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def summary(samples: list[float], digits: int = 4) -> dict[str, Any]:
    """Median (the figure), min, max and the raw samples of one measurement."""
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered), digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "n": len(ordered),
        "samples": [round(s, digits) for s in samples],
    }


def wait_until(predicate: Callable[[], Any], timeout: float, poll: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def ratio(a: float, b: float, digits: int = 2) -> float | None:
    return round(a / b, digits) if b else None


class Reps:
    """Up to ``planned`` repetitions; with ``seconds``, stop before one that would overrun it.

    The first repetition always runs. ``info()`` says how many ran, for the report to flag a
    figure that got fewer than planned because the engine was too slow for the time budget.
    """

    def __init__(self, planned: int, seconds: float | None = None) -> None:
        self.planned, self.seconds, self.done = planned, seconds, 0

    def __iter__(self):
        t0 = time.perf_counter()
        for i in range(self.planned):
            if i and self.seconds is not None:
                elapsed = time.perf_counter() - t0
                if elapsed + elapsed / i > self.seconds:
                    return
            yield i
            self.done += 1

    def info(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "done": self.done,
            "budget_s": self.seconds,
            "cut_by_budget": self.done < self.planned,
        }
