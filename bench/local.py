"""Family 3: a workflow of ten local steps (``bench.local10``) vs DBOS Transact's ten-step workflow.

Durable is measured two ways, said apart in the report:
- ``worker``: started with ``durable.start()``, the turn runs in the celery worker subprocess;
  timed until a count sees them all completed, and again the way an application waits for its runs
  (``worker_results``): a loop of ``durable.start`` then ``durable.result`` of each, as DBOS's
  figure is a loop of ``start_workflow`` then ``get_result`` of each.
- ``in_process``: the run row is created by ``durable.start()`` (its Celery message dropped) and
  ``durable.engine.turn.advance()`` runs the turn in this process: what DBOS does, which runs
  workflows inside the application process.
DBOS runs in its own process (``bench.dbos_peer``) on the same PostgreSQL (database dbos_bench).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import durable
from bench import dispatched
from bench.env import run_module, truncate
from bench.stats import Reps, ratio, summary
from bench.workloads import STEPS

WORKFLOW = "bench.local10"


def _in_process_once() -> float:
    from durable.engine import turn

    t0 = time.perf_counter()
    run_id = durable.start(WORKFLOW).id
    outcome = turn.advance(run_id)
    elapsed = time.perf_counter() - t0
    if outcome != "completed":
        raise RuntimeError(f"in-process run {run_id} ended {outcome}")
    return elapsed


def _in_process_many(n: int, threads: int) -> float:
    truncate()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: _in_process_once(), range(n)))
    return time.perf_counter() - t0


def in_process(n: int, planned: int, latency_reps: int, threads: int, budget: float | None = None) -> dict:
    from django.db import connections

    from durable import dispatch

    saved = dispatch.install(replace(dispatch.transport, send=lambda message: None))
    try:
        truncate()
        for _ in range(5):
            _in_process_once()
        truncate()
        seq = [_in_process_once() for _ in range(latency_reps)]
        reps = Reps(planned, budget)
        many = [_in_process_many(n, threads) for _ in reps]
    finally:
        dispatch.install(saved)
        connections.close_all()
    return {"sequential_s": summary(seq), "throughput": _throughput(n, many, reps.info()), "threads": threads}


def via_worker(n: int, planned: int, latency_reps: int, budget: float | None = None) -> dict:
    truncate()
    for _ in range(3):
        dispatched.durable_once(WORKFLOW)
    seq = [dispatched.durable_once(WORKFLOW) for _ in range(latency_reps)]
    # Half the budget each: counted to the end, and waited for by result.
    reps = Reps(planned, budget and budget / 2)
    many = [dispatched.durable_many(WORKFLOW, n)["total_s"] for _ in reps]
    waited = Reps(planned, budget and budget / 2)
    by_result = [_results_many(n) for _ in waited]
    return {
        "sequential_s": summary(seq),
        "throughput": _throughput(n, many, reps.info()),
        "throughput_results": _throughput(n, by_result, waited.info()),
    }


def _results_many(n: int) -> float:
    """A loop of ``durable.start``, then ``durable.result`` of each, in start order."""
    truncate()
    t0 = time.perf_counter()
    handles = [durable.start(WORKFLOW) for _ in range(n)]
    outputs = {durable.result(handle.id, timeout=600) for handle in handles}
    elapsed = time.perf_counter() - t0
    if outputs != {sum(range(STEPS))}:
        raise RuntimeError(f"{WORKFLOW} runs returned {sorted(outputs)[:5]}")
    return elapsed


def dbos(n: int, planned: int, latency_reps: int, budget: float | None = None) -> dict:
    """DBOS in its own process: N workflows through ``DBOS.start_workflow`` (its own executor)."""
    args = (str(n), str(planned), str(latency_reps), str(budget or 0))
    raw = json.loads(run_module("bench.dbos_peer", *args, timeout=1800))
    return {
        "sequential_s": summary(raw["sequential_s"]),
        "throughput": _throughput(n, raw["start_workflow_s"], raw["reps"]),
    }


def _throughput(n: int, seconds: list[float], reps: dict) -> dict:
    runs = summary([n / s for s in seconds], 1)
    return {"n": n, "runs_per_s": runs, "steps_per_s": round(runs["median"] * STEPS, 1), "reps": reps}


def compare(worker: dict, inproc: dict, peer: dict) -> dict:
    best = peer["throughput"]["runs_per_s"]["median"]
    return {
        "worker_over_dbos_throughput": ratio(worker["throughput"]["runs_per_s"]["median"], best),
        "worker_results_over_dbos_throughput": ratio(
            worker["throughput_results"]["runs_per_s"]["median"], best
        ),
        "in_process_over_dbos_throughput": ratio(inproc["throughput"]["runs_per_s"]["median"], best),
        "dbos_over_in_process_latency": ratio(
            peer["sequential_s"]["median"], inproc["sequential_s"]["median"]
        ),
        "goal_min_ratio": 4.0,
    }
