"""The ceiling: single-row INSERT + COMMIT per second from Python on the same PostgreSQL."""

from __future__ import annotations

import time

import psycopg

from bench.env import DURABLE_DB, PG
from bench.stats import summary


def commits_per_second(seconds: float) -> float:
    with psycopg.connect(f"{PG}/{DURABLE_DB}") as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_ceiling (id bigserial PRIMARY KEY, v jsonb)")
        conn.execute("TRUNCATE bench_ceiling")
        conn.commit()
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute("INSERT INTO bench_ceiling (v) VALUES (%s)", ('{"output": 1}',))
            conn.commit()
            count += 1
        return count / (time.perf_counter() - t0)


def run(reps: int, seconds: float) -> dict:
    """``reps`` windows of ``seconds`` each (a fixed cost: no time budget applies)."""
    commits_per_second(0.5)  # warm-up
    return {
        "commits_per_s": summary([commits_per_second(seconds) for _ in range(reps)], 1),
        "window_s": seconds,
    }


def fractions(ceiling: dict, local: dict, threads: int) -> dict:
    """Local steps per second, measured by family 3, over the commit ceiling measured next to them."""
    from bench.workloads import STEPS

    top = ceiling["commits_per_s"]["median"]
    found = {
        "in_process_sequential": (
            "in-process, one run at a time (one connection, as the ceiling)",
            STEPS / local["in_process"]["sequential_s"]["median"],
        ),
        "in_process_concurrent": (
            f"in-process, {threads} threads",
            local["in_process"]["throughput"]["steps_per_s"],
        ),
        "worker_concurrent": ("through the worker, N at once", local["worker"]["throughput"]["steps_per_s"]),
    }
    return {
        key: {"what": what, "steps_per_s": round(rate, 1), "fraction": round(rate / top, 3), "ceiling": top}
        for key, (what, rate) in found.items()
    }
