"""1,000 runs whose one ``async def`` step awaits a one-second wait, on a prefork worker of
concurrency 2, beside the same 1,000 waits as plain Celery tasks on Celery's gevent pool.

    .venv-bench/bin/python bench/async_steps.py      # about a minute (--n, --reps)

durable: ``bench.async_one`` runs started back to back with ``durable.start()``, timed from the
first start until every run is seen completed (one COUNT every 20 ms). Each pool process awaits
its async attempts side by side on its loop (``ASYNC_STEPS_PER_PROCESS``, default 100, so two
processes hold 200 at once: the bench sets it to N so the bound is not what is measured; the
figure with the default is reported too). Celery: N ``bench.gevent_wait`` tasks sent with
``apply_async`` to a ``--pool=gevent --concurrency=N`` worker, timed until a Redis counter they
increment reaches N. For durable it also reports when the last first turn began (the database's
clock, from the first run written): while that is most of the wall time, the first turns, not
the waits, set the pace. The goal (issue 26): durable <= 3 s. Writes bench/results/async_steps.json
and .md. Its own database ``durable_async`` (``BENCH_ASYNC_DB``) and Redis db 9
(``BENCH_ASYNC_REDIS``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402
from bench.stats import summary, wait_until  # noqa: E402

DB = os.environ.get("BENCH_ASYNC_DB", "durable_async")
REDIS = os.environ.get("BENCH_ASYNC_REDIS", "redis://127.0.0.1:6379/9")
GOAL = 3.0


def log(message: str) -> None:
    print(f"[async {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def configure() -> None:
    env.DURABLE_DB = env.DBOS_DB = DB
    env.REDIS = REDIS
    env.ENV["DATABASE_URL"] = f"{env.PG}/{DB}"
    env.ENV["CELERY_BROKER_URL"] = REDIS


def worker(name: str, settings: dict[str, str], pool: str = "prefork", concurrency: int = 2) -> env.Worker:
    made = env.Worker(name, concurrency=concurrency if pool == "prefork" else 1, settings=settings)
    argv = made.process.argv
    argv[argv.index("bench.workloads")] = "bench.workloads,bench.async_workloads"
    if pool != "prefork":
        argv[argv.index("--pool=prefork")] = f"--pool={pool}"
        argv[argv.index("--concurrency=1")] = f"--concurrency={concurrency}"
        made.concurrency = 0  # a green pool forks no children to wait for
    return made


def durable_once(n: int, *, atomic: bool = False) -> dict[str, float]:
    """``atomic``: the loop of starts inside one ``transaction.atomic()`` (a view under
    ATOMIC_REQUESTS, a task that starts them all or none): the first turns leave after its commit,
    shared out over messages of up to 50 runs."""
    from django.db import transaction

    import durable
    from durable.models import Run

    env.truncate()
    t0 = time.perf_counter()
    with transaction.atomic() if atomic else contextlib.nullcontext():
        for i in range(n):
            durable.start("bench.async_one", i)
    started = time.perf_counter() - t0
    done = Run.objects.filter(status="completed")
    wait_until(lambda: done.count() == n, timeout=600, poll=0.02, what=f"{n} runs")
    wall = time.perf_counter() - t0
    return {"wall": wall, "starting": started, "first_turns": _last_first_turn()}


def _last_first_turn() -> float:
    """Seconds from the first run written to the last first turn begun, by the database's clock:
    where the first turns, not the waits, set the pace, this is most of the wall time."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM MAX(started_at) - MIN(created_at)) FROM durable_run")
        (seconds,) = cursor.fetchone()
    return float(seconds)


def gevent_once(n: int) -> dict[str, float]:
    import redis

    from bench import async_workloads

    counter = redis.Redis.from_url(REDIS)
    counter.delete(async_workloads.DONE_KEY)
    t0 = time.perf_counter()
    for i in range(n):
        async_workloads.gevent_wait.apply_async((i,), queue="celery")
    started = time.perf_counter() - t0
    wait_until(
        lambda: int(counter.get(async_workloads.DONE_KEY) or 0) >= n,
        timeout=600,
        poll=0.02,
        what=f"{n} tasks",
    )
    return {"wall": time.perf_counter() - t0, "starting": started, "first_turns": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=env.RESULTS)
    parser.add_argument("--only", default="durable,durable_atomic,durable_default_bound,gevent")
    args = parser.parse_args()
    configure()
    began = time.perf_counter()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    source = env.source_hash()
    env.setup()
    import bench.async_workloads  # noqa: F401

    samples: dict[str, list[dict[str, float]]] = {
        "durable": [],
        "durable_atomic": [],
        "durable_default_bound": [],
        "gevent": [],
    }
    variants = {
        "durable": ({"DURABLE_ASYNC_STEPS_PER_PROCESS": str(args.n)}, "prefork", 2, durable_once),
        "durable_atomic": (
            {"DURABLE_ASYNC_STEPS_PER_PROCESS": str(args.n)},
            "prefork",
            2,
            functools.partial(durable_once, atomic=True),
        ),
        "durable_default_bound": ({}, "prefork", 2, durable_once),
        "gevent": ({}, "gevent", args.n, gevent_once),
    }
    rss: dict[str, Any] = {}
    chosen = args.only.split(",")
    for name, (settings, pool, concurrency, once) in variants.items():
        if name not in chosen:
            continue
        running = worker(name, settings, pool, concurrency)
        try:
            running.start()
            once(min(args.n, 50))  # warm-up
            for rep in range(args.reps):
                samples[name].append(once(args.n))
                log(f"{name} {rep + 1}/{args.reps}: {samples[name][-1]['wall']:.2f}s")
            rss[name] = running.rss()
        finally:
            running.stop()
    figures = {
        name: {
            key: summary([s[key] for s in runs], 3)
            for key in ("wall", "starting", "first_turns")
            if all(s.get(key) is not None for s in runs)
        }
        for name, runs in samples.items()
        if runs
    }
    gevent_wall = figures.get("gevent", {}).get("wall", {}).get("median")
    walls = {
        name: figures[name]["wall"]["median"] for name in ("durable", "durable_atomic") if name in figures
    }
    data = {
        "meta": {
            "command": "bench/async_steps.py " + " ".join(sys.argv[1:]),
            "params": {"n": args.n, "reps": args.reps, "wait_s": bench.async_workloads.WAIT},
            "database": DB,
            "broker": REDIS,
            **env.run_meta(source, loadavg_start, began, rss),
        },
        "results": {
            "seconds": figures,
            # The goal holds for each way of starting: a loop of starts, and the loop in one transaction.
            "ratio_to_gevent": {
                name: round(wall / gevent_wall, 2) if gevent_wall else None for name, wall in walls.items()
            },
            "goal_s": GOAL,
            "met": {name: wall <= GOAL for name, wall in walls.items()},
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_steps.json").write_text(json.dumps(data, indent=2) + "\n")
    (args.out / "async_steps.md").write_text(markdown(data))
    print(markdown(data))
    return 0


def markdown(data: dict[str, Any]) -> str:
    meta, results = data["meta"], data["results"]
    seconds = results["seconds"]
    n = meta["params"]["n"]
    labels = {
        "durable": f"durable, `async def` step, prefork -c 2, ASYNC_STEPS_PER_PROCESS={n}",
        "durable_atomic": "durable, same, the loop of starts in one `transaction.atomic()`",
        "durable_default_bound": "durable, same, default ASYNC_STEPS_PER_PROCESS=100",
        "gevent": f"Celery plain tasks, gevent pool -c {n}, `time.sleep` patched",
    }
    lines = [
        f"{n} runs, one {meta['params']['wait_s']:g} s wait each · {meta['params']['reps']} repetitions, "
        f"medians · {meta['machine'].get('cores', '?')} cores · sources `{meta['source_hash'][:12]}`",
        "",
        "| what | wall time, start to all done | of which starting them | last first turn begun |",
        "| --- | --- | --- | --- |",
    ]
    for name, label in labels.items():
        if name in seconds:
            wall, starting = seconds[name]["wall"]["median"], seconds[name]["starting"]["median"]
            turns = seconds[name].get("first_turns")
            began = f"{turns['median']:.2f} s" if turns else "n/a"
            lines.append(f"| {label} | {wall:.2f} s | {starting:.2f} s | {began} |")
    lines.append("")
    ways = {"durable": "durable, a loop of starts", "durable_atomic": "durable, the loop in one transaction"}
    for name, met in results["met"].items():
        lines.append(
            f"- {ways[name]}: {results['ratio_to_gevent'][name]}x gevent · goal <= {results['goal_s']:g} s: "
            f"{'met' if met else 'missed'}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
