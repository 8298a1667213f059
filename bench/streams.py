"""A stream of 1,000 values out of one run, read live by a client, beside DBOS Transact's.

    python bench/streams.py           # 5 repetitions each; about a minute

durable: ``durable.start`` of a workflow whose one step writes N values with
``durable.write_stream`` (each its own commit, as a step writes them while it works) and whose
body then closes the stream; this process reads it with ``durable.read_stream`` from the start,
while the run runs on a prefork worker (the suite's settings, PostgreSQL and Redis). DBOS: the
same workflow and step with ``DBOS.write_stream`` / ``DBOS.read_stream``, in its own process on
the same PostgreSQL (``bench/dbos_streams.py``). Timed: from the start call until the reader has
the last value. Writes bench/results/streams.json and streams.md and, when writing there, the
table between the ``bench:streams`` markers of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env, report  # noqa: E402
from bench.stats import ratio, summary  # noqa: E402

N = 1000


def log(message: str) -> None:
    print(f"[streams {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stream_worker() -> env.Worker:
    worker = env.Worker("streams")
    argv = worker.process.argv
    argv[argv.index("bench.workloads")] = "bench.workloads,bench.stream_workloads"
    return worker


def once(n: int) -> float:
    import durable

    env.truncate()
    t0 = time.perf_counter()
    run_id = durable.start("bench.stream_flow", n).id
    got = list(durable.read_stream(run_id, "values", timeout=60))
    elapsed = time.perf_counter() - t0
    if got != list(range(n)):
        raise RuntimeError(f"read {len(got)} values, not the {n} written in order")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--n", type=int, default=N, help="values per stream")
    parser.add_argument("--out", type=Path, default=env.RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    env.setup()
    import bench.stream_workloads  # noqa: F401 - registers the workflow this process starts

    source = env.source_hash(env.snapshot_dir)
    worker = stream_worker()
    try:
        worker.start()
        once(args.n)  # warm-up
        durable_s = [once(args.n) for _ in range(args.reps)]
        worker_rss = worker.rss()
    finally:
        worker.stop()
    log("DBOS peer")
    dbos_s = json.loads(env.run_module("bench.dbos_streams", str(args.n), str(args.reps)))["seconds"]
    results = {"durable": summary(durable_s, 4), "dbos": summary(dbos_s, 4)}
    data = {
        "meta": {
            "command": "bench/streams.py " + " ".join(sys.argv[1:]),
            "params": {"reps": args.reps, "n": args.n},
            **env.run_meta(source, loadavg_start, started, worker_rss),
        },
        "results": {
            "seconds": results,
            "ratio": ratio(results["durable"]["median"], results["dbos"]["median"]),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "streams.json").write_text(json.dumps(data, indent=2) + "\n")
    (args.out / "streams.md").write_text(markdown(data))
    if args.out.resolve() == env.RESULTS.resolve() and report.update_tables("streams", markdown(data)):
        log(f"rewrote the streams table in {report.TABLES}")
    print(markdown(data))
    return 0


def markdown(data: dict[str, Any]) -> str:
    meta, results = data["meta"], data["results"]
    n, machine = meta["params"]["n"], meta["machine"]
    lines = [
        f"{meta['params']['reps']} repetitions, medians · {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores "
        f"· celery prefork, concurrency {env.CONCURRENCY} · sources `{meta['source_hash'][:12]}`",
        "",
        f"| a stream of {n:,} values, written by one step, read live from the start | until the last value | per value | ratio |",
        "| --- | --- | --- | --- |",
    ]
    for name, label in (
        ("durable", "durable (`write_stream` in a step on a worker, `read_stream` here)"),
        ("dbos", "DBOS Transact (`DBOS.write_stream` / `DBOS.read_stream`, in process)"),
    ):
        median = results["seconds"][name]["median"]
        share = results["ratio"] if name == "durable" else 1
        lines.append(f"| {label} | {median * 1000:.0f} ms | {median / n * 1e6:.0f} µs | {share}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
