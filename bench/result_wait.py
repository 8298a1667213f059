"""Waiting for a result: ``durable.start()`` + ``result()`` of a one-step workflow against Celery's
``apply_async().get()`` of one task, on the same worker, broker and PostgreSQL, one at a time.

    .venv-bench/bin/python bench/result_wait.py [--reps 100]

durable is measured as shipped (woken by PostgreSQL's notice of the run's end) and with the
notices off (the polling fallback). Celery's result backend is the project's (django-db, which
the example project's set-up uses): ``get()`` polls it, measured with its default interval (0.5 s) and
with a 2 ms one, the best it can do there; the goal compares durable with the faster.
Writes bench/results/result_wait.json and .md, and the ``bench:result`` table of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402

GOAL = 1.5


def durable_once() -> float:
    import durable

    t0 = time.perf_counter()
    if durable.start("bench.one_step").result(timeout=60) != 1:
        raise RuntimeError("bench.one_step returned something else")
    return time.perf_counter() - t0


def celery_once(interval: float) -> float:
    from bench import workloads

    t0 = time.perf_counter()
    if workloads.noop_last.apply_async((1,)).get(timeout=60, interval=interval) != 1:
        raise RuntimeError("bench.noop_last returned something else")
    return time.perf_counter() - t0


def measure(reps: int) -> dict:
    from bench.stats import ratio, summary
    from durable import waiting

    shipped = waiting.listener
    polling = lambda *aliases: None  # noqa: E731 - the notices off: result() polls as before
    samples: dict[str, list[float]] = {
        "durable": [],
        "durable_polling": [],
        "celery_2ms": [],
        "celery_default": [],
    }
    for _ in range(5):  # warm-up: connections, pool children, the listener
        durable_once(), celery_once(0.002)
    for i in range(reps):
        samples["durable"].append(durable_once())
        samples["celery_2ms"].append(celery_once(0.002))
        waiting.listener = polling
        try:
            samples["durable_polling"].append(durable_once())
        finally:
            waiting.listener = shipped
        if i < max(10, reps // 5):  # 0.5 s each: fewer of them
            samples["celery_default"].append(celery_once(0.5))
        if i % 20 == 19:
            env.truncate()
    out = {name: summary(values) for name, values in samples.items()}
    out["ratio_durable_over_celery"] = ratio(out["durable"]["median"], out["celery_2ms"]["median"])
    out["ratio_polling_over_celery"] = ratio(out["durable_polling"]["median"], out["celery_2ms"]["median"])
    out["goal_max_ratio"] = GOAL
    return out


def table(r: dict) -> list[str]:
    def ms(key: str) -> str:
        return f"{r[key]['median'] * 1000:.1f} ms"

    verdict = "met" if r["ratio_durable_over_celery"] <= GOAL else "**missed**"
    return [
        "| Wait for one result | median | vs Celery (2 ms polls) | samples |",
        "| --- | --- | --- | --- |",
        f"| durable `start()` + `result()`, woken by the run's end notice | {ms('durable')} | "
        f"{r['ratio_durable_over_celery']}x (goal <= {GOAL}x: {verdict}) | {r['durable']['n']} |",
        f"| the same, notices off (polling fallback, back-off up to 50 ms) | {ms('durable_polling')} | "
        f"{r['ratio_polling_over_celery']}x | {r['durable_polling']['n']} |",
        f"| Celery `apply_async().get(interval=0.002)`, django-db backend | {ms('celery_2ms')} | 1x | "
        f"{r['celery_2ms']['n']} |",
        f"| Celery `apply_async().get()` (default 0.5 s polls) | {ms('celery_default')} | "
        f"{round(r['celery_default']['median'] / r['celery_2ms']['median'], 2)}x | {r['celery_default']['n']} |",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=env.RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    env.setup()
    env.truncate()
    source = env.source_hash(env.snapshot_dir)
    worker = env.Worker("result").start()
    try:
        results = measure(args.reps)
    finally:
        worker.stop()
    env.truncate()
    m = env.machine()
    line = (
        f"Run {m['date']} · {m['cpu']}, {m['cores']} cores · PostgreSQL {m['postgresql']} · Redis {m['redis']} · "
        f"{m['worker']} · sources `{source}` · {time.perf_counter() - started:.0f} s"
    )
    data = {"meta": {"line": line, "source_hash": source, "reps": args.reps}, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result_wait.json").write_text(json.dumps(data, indent=2) + "\n")
    text = "\n".join(["# Waiting for one result", "", line, "", *table(results), ""])
    (args.out / "result_wait.md").write_text(text)
    from bench import report

    if args.out.resolve() == env.RESULTS.resolve() and report.update_tables(
        "result", "\n".join([line, "", *table(results)])
    ):
        print(f"rewrote the result table in {report.TABLES}", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
