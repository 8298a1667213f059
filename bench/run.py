"""Run every benchmark on PostgreSQL + Redis; write bench/results/latest.json and latest.md.

    .venv-bench/bin/python bench/run.py           # the full run (N=1000, 5 repetitions)
    .venv-bench/bin/python bench/run.py --quick   # N=100, fewer repetitions, for development

See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402

FAMILIES = ("ceiling", "sweeps", "latency", "throughput", "broker", "plain", "local", "rss")

FULL = {
    "n": 1000,
    "reps": 5,
    "latency_reps": 20,
    "sweep_count": 10_000,
    "ceiling_s": 2.0,
    "threads": 8,
    "rss_first": 1000,
    "rss_last": 10_000,
}
QUICK = {
    "n": 100,
    "reps": 3,
    "latency_reps": 5,
    "sweep_count": 2_000,
    "ceiling_s": 1.0,
    "threads": 8,
    "rss_first": 100,
    "rss_last": 1000,
}

#: Seconds each family may spend on its repetitions, in a full run whose --budget is the default
#: 840 s (they scale with --budget). Time a family leaves unused passes to the families after it,
#: and time one overruns (its first repetition always runs) is taken from them. With the engine at
#: its goals every family fits its planned repetitions; a slower engine gets fewer, and the report
#: flags those figures.
BUDGET_SHARES = {
    "sweeps": 60,
    "dbos": 100,
    "latency": 30,
    "throughput": 200,
    "broker": 200,
    "plain": 40,
    "local_worker": 130,
    "local_in_process": 60,
    "rss": 80,
}
DEFAULT_BUDGET = sum(BUDGET_SHARES.values()) + 25  # + the ceiling and start-up


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N=100 and fewer repetitions")
    parser.add_argument("--only", help=f"comma-separated families to run, of {','.join(FAMILIES)}")
    parser.add_argument("--out", type=Path, default=env.RESULTS, help="directory for latest.json / latest.md")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for the whole suite (full default {DEFAULT_BUDGET}; quick and 0: no limit)",
    )
    args = parser.parse_args()
    params = dict(QUICK if args.quick else FULL)
    total = args.budget if args.budget is not None else (0 if args.quick else DEFAULT_BUDGET)
    params["budget_s"] = total or None
    shares = {k: v * total / DEFAULT_BUDGET for k, v in BUDGET_SHARES.items()}
    ledger = {"allotted": 0.0, "spent": 0.0}

    def budget(name: str) -> float | None:
        """This family's share plus what earlier families left unused (or minus what they overran)."""
        if not total:
            return None
        return max(0.0, ledger["allotted"] + shares[name] - ledger["spent"])

    only = set(args.only.split(",")) if args.only else set(FAMILIES)
    if only - set(FAMILIES):
        parser.error(f"unknown families: {', '.join(sorted(only - set(FAMILIES)))}")

    started = time.perf_counter()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    env.setup()
    source = env.source_hash(env.snapshot_dir)
    log(
        f"measuring the sources {source} copied to {env.snapshot_dir}; settings {env.ENV['DJANGO_SETTINGS_MODULE']}"
    )
    results: dict = {}
    timings: dict = {}
    loads: dict = {}  # the 1-minute load average as each family ends: other work on the machine shows here

    def family(name: str, fn, gate: str | None = None):
        if (gate or name) not in only:
            return None
        log(f"{name} ...")
        t0 = time.perf_counter()
        results[name] = fn()
        timings[name] = round(time.perf_counter() - t0, 1)
        if name in shares:
            ledger["allotted"] += shares[name]
            ledger["spent"] += timings[name]
        loads[name] = round(os.getloadavg()[0], 2)
        log(f"{name} done in {timings[name]} s (load average {loads[name]})")
        return results[name]

    from bench import ceiling, dispatched, local, plain_chain, report, rss, sweeps

    p = params
    family("ceiling", lambda: ceiling.run(p["reps"], p["ceiling_s"]))
    family("sweeps", lambda: sweeps.run(p["sweep_count"], p["reps"], budget("sweeps")))
    peer = family("dbos", lambda: local.dbos(p["n"], p["reps"], p["latency_reps"], budget("dbos")), "local")
    worker_rss = None
    # The second anchor: a plain Celery app's chain, on a worker of its own of the same shape, idle
    # beside durable's while families 1 and their broker twins interleave its chains with theirs.
    plain = plain_chain.Worker(env.CONCURRENCY).start() if "plain" in only else None
    once = plain_chain.once if plain is not None else None
    try:
        if "broker" in only:
            # Its own worker, with EAGER_STEPS off: every step crosses the broker.
            eager_off = env.Worker(name="broker", settings={"DURABLE_EAGER_STEPS": "0"}).start()
            try:
                family("broker", lambda: dispatched.broker(p["latency_reps"], p["n"], budget("broker"), once))
            finally:
                eager_off.stop()
        if only & {"latency", "throughput", "local"}:
            worker = env.Worker().start()
            try:
                family("latency", lambda: dispatched.latency(p["latency_reps"], budget("latency"), once))
                family("throughput", lambda: dispatched.throughput(p["n"], p["reps"], budget("throughput")))
                if "local" in only:
                    via_worker = family(
                        "local_worker",
                        lambda: local.via_worker(
                            p["n"], p["reps"], p["latency_reps"], budget("local_worker")
                        ),
                        "local",
                    )
                worker_rss = worker.rss()
            finally:
                worker.stop()
            if "local" in only and "ceiling" in only:
                # Again, next to the local families it is compared with: the families before (thousands
                # of runs written, then truncated) leave PostgreSQL busier than it was at the start.
                family("ceiling_local", lambda: ceiling.run(p["reps"], p["ceiling_s"]), "ceiling")
            if "local" in only:
                inproc = family(
                    "local_in_process",
                    lambda: local.in_process(
                        p["n"], p["reps"], p["latency_reps"], p["threads"], budget("local_in_process")
                    ),
                    "local",
                )
                results["local"] = {
                    "worker": results.pop("local_worker"),
                    "in_process": results.pop("local_in_process"),
                }
                if peer is not None:
                    results["local"]["dbos"] = peer
                    results.pop("dbos")
                    results["local"]["compare"] = local.compare(via_worker, inproc, peer)
                    if "ceiling" in results:
                        results["ceiling"]["next_to_local"] = results.pop("ceiling_local")
                        results["ceiling"]["fractions"] = ceiling.fractions(
                            results["ceiling"]["next_to_local"], results["local"], p["threads"]
                        )
        if plain is not None:
            family("plain", lambda: plain_chain.at_once(p["n"], p["reps"], budget("plain")))
    finally:
        if plain is not None:
            plain.stop()
    family("rss", lambda: rss.run(p["rss_first"], p["rss_last"], budget("rss")))
    env.truncate()

    data = {
        "meta": {
            "mode": "quick" if args.quick else "full",
            "params": params,
            "family_seconds": timings,
            "family_loadavg_1m": loads,
            **env.run_meta(source, loadavg_start, started, worker_rss),
        },
        "results": results,
    }
    json_path, md_path = report.write(data, args.out)
    log(f"wrote {json_path} and {md_path} in {data['meta']['total_s']} s")
    # Only a full run of every family into the results folder speaks for docs/benchmarks.md.
    speaks = not args.quick and only == set(FAMILIES) and args.out.resolve() == env.RESULTS.resolve()
    if speaks and report.update_tables("suite", report.suite_block(data)):
        log(f"rewrote the benchmark table in {report.TABLES}")
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
