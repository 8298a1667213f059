"""Families 1 and 2: a workflow of ten dispatched no-op steps vs a Celery chain of ten no-op tasks.

The worker consumes the steps' queue, so it runs them in place, inside the turn (EAGER_STEPS);
``bench.dispatched10_timed`` is the same workflow whose steps declare ``timeout="30s"``. ``broker``
measures ``bench.dispatched10`` and the chain again on a worker started with EAGER_STEPS off, so
every step crosses the broker.

Both run on the same worker (one ``celery worker`` subprocess, prefork) and the same Redis, and
both results land in the same PostgreSQL, which the bench polls the same way for both: durable's
run row, and the chain's last task's result row (django-celery-results).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import durable
from bench import workloads
from bench.env import truncate
from bench.stats import Reps, ratio, summary, wait_until

#: The same workflow whose steps declare timeout="30s" (run in place, under durable's limits).
TIMED = "bench.dispatched10_timed"
POLL = 0.002  # seconds between two looks at the result, for durable and Celery alike
TERMINAL = ("completed", "failed", "cancelled", "dead")


def _one(sql: str, param: str) -> tuple | None:
    """One row of a plain query on this process's connection: the bench's polls stay light, so
    the waiting takes as little as it can of the CPU the worker and PostgreSQL share."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql, [param])
        return cur.fetchone()


def _run_status(run_id: str) -> str | None:
    found = _one("SELECT status FROM durable_run WHERE id = %s", run_id)
    return found[0] if found else None


def _chain_done(task_id: str) -> bool:
    return (
        _one(
            "SELECT 1 FROM django_celery_results_taskresult WHERE task_id = %s AND status = 'SUCCESS'",
            task_id,
        )
        is not None
    )


def durable_once(workflow: str) -> float:
    t0 = time.perf_counter()
    run_id = durable.start(workflow).id
    status = wait_until(lambda: (s := _run_status(run_id)) in TERMINAL and s, 120, POLL, f"run {run_id}")
    elapsed = time.perf_counter() - t0
    if status != "completed":
        raise RuntimeError(f"run {run_id} ended {status}: {durable.get_run(run_id).error}")
    return elapsed


def durable_api_once(workflow: str) -> float:
    """The same, waiting with ``durable.result()`` as shipped (its own back-off poll)."""
    t0 = time.perf_counter()
    durable.start(workflow).result(timeout=120)
    return time.perf_counter() - t0


def chain_once() -> float:
    t0 = time.perf_counter()
    task_id = workloads.celery_chain().apply_async().id
    wait_until(lambda: _chain_done(task_id), 120, POLL, "chain")
    return time.perf_counter() - t0


def durable_many(workflow: str, n: int) -> dict[str, float]:
    """Start ``n`` runs back to back; seconds until all completed (and until all were sent)."""
    from durable.models import Run

    truncate()
    t0 = time.perf_counter()
    for _ in range(n):
        durable.start(workflow)
    sent = time.perf_counter() - t0

    def done() -> bool:
        finished = Run.objects.filter(status__in=TERMINAL).count()
        if finished >= n and Run.objects.exclude(status="completed").exists():
            raise RuntimeError(f"some {workflow} runs did not complete")
        return finished >= n

    wait_until(done, 1800, 0.02, f"{n} {workflow} runs")
    return {"total_s": time.perf_counter() - t0, "send_s": sent}


def chains_many(n: int) -> dict[str, float]:
    from django_celery_results.models import TaskResult

    truncate()
    t0 = time.perf_counter()
    for _ in range(n):
        workloads.celery_chain().apply_async()
    sent = time.perf_counter() - t0
    wait_until(lambda: TaskResult.objects.filter(status="SUCCESS").count() >= n, 1800, 0.02, f"{n} chains")
    return {"total_s": time.perf_counter() - t0, "send_s": sent}


def latency(latency_reps: int, budget: float | None = None, plain: Callable[[], float] | None = None) -> dict:
    """Family 1: one run at a time, start to result; durable and Celery interleaved (``plain``:
    the plain Celery app's chain too, its worker idle beside this one)."""
    truncate()
    for _ in range(3):  # warm-up: imports, connections, pool children
        durable_once("bench.dispatched10"), durable_once(TIMED), chain_once()
        if plain is not None:
            plain()
    d, t, c, api, p = [], [], [], [], []
    reps = Reps(latency_reps, budget)
    for _ in reps:
        d.append(durable_once("bench.dispatched10"))
        t.append(durable_once(TIMED))
        c.append(chain_once())
        if plain is not None:
            p.append(plain())
    for _ in range(max(5, latency_reps // 4)):
        api.append(durable_api_once("bench.dispatched10"))
    d_s, t_s, c_s = summary(d), summary(t), summary(c)
    return {
        "durable_s": d_s,
        "durable_timed_s": t_s,
        "ratio_timed_over_chain": ratio(t_s["median"], c_s["median"]),
        "chain_s": c_s,
        "durable_via_result_api_s": summary(api),
        "ratio_durable_over_chain": ratio(d_s["median"], c_s["median"]),
        **({"plain_chain_s": summary(p)} if p else {}),
        "goal_max_ratio": 1.5,
        "reps": reps.info(),
    }


def throughput(n: int, planned: int, budget: float | None = None) -> dict:
    """Family 2: n started at once; runs (chains) per second until the last completes."""
    d, t, c = [], [], []
    reps = Reps(planned, budget)
    for _ in reps:
        d.append(durable_many("bench.dispatched10", n))
        t.append(durable_many(TIMED, n))
        c.append(chains_many(n))
    d_s = summary([n / r["total_s"] for r in d], 1)
    t_s = summary([n / r["total_s"] for r in t], 1)
    c_s = summary([n / r["total_s"] for r in c], 1)
    return {
        "n": n,
        "durable_runs_per_s": d_s,
        "durable_timed_runs_per_s": t_s,
        "ratio_chain_over_timed": ratio(c_s["median"], t_s["median"]),
        "chain_per_s": c_s,
        "durable_send_s": summary([r["send_s"] for r in d]),
        "chain_send_s": summary([r["send_s"] for r in c]),
        "ratio_chain_over_durable": ratio(c_s["median"], d_s["median"]),
        "goal_max_ratio": 1.5,
        "reps": reps.info(),
    }


def broker(
    latency_reps: int, n: int, budget: float | None = None, plain: Callable[[], float] | None = None
) -> dict:
    """Families 1 and 2 again, on a worker started with EAGER_STEPS off (``env.Worker(settings=)``):
    every step crosses the broker, as a step on another worker's queue does. One at a time,
    interleaved with the chain, then ``n`` of each started at once (one repetition: at four times
    the chain's time, a thousand such runs take minutes)."""
    truncate()
    for _ in range(3):
        durable_once("bench.dispatched10"), chain_once()
        if plain is not None:
            plain()
    d, c, p = [], [], []
    reps = Reps(latency_reps, budget)
    for _ in reps:
        d.append(durable_once("bench.dispatched10"))
        c.append(chain_once())
        if plain is not None:
            p.append(plain())
    d_s, c_s = summary(d), summary(c)
    many_d, many_c = durable_many("bench.dispatched10", n), chains_many(n)
    return {
        "durable_s": d_s,
        "chain_s": c_s,
        "ratio_durable_over_chain": ratio(d_s["median"], c_s["median"]),
        "n": n,
        "durable_runs_per_s": round(n / many_d["total_s"], 1),
        "chain_per_s": round(n / many_c["total_s"], 1),
        "ratio_chain_over_durable": ratio(many_d["total_s"], many_c["total_s"]),
        **({"plain_chain_s": summary(p)} if p else {}),
        "goal_max_ratio": 1.5,
        "reps": reps.info(),
    }
