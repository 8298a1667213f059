"""The cost of a step ``concurrency`` limit that is never reached, beside the same workflow without.

    python bench/flow.py              # 5 interleaved repetitions; under a minute

Two workloads, each as twins that differ only by the limit (``bench/flow_workloads.py``), and a third
that takes the limit from a ``durable.Lane`` shared by two steps: ten
steps one after the other, and a fan of 100. The free twin's steps carry a timeout, as real steps
do; in sequence both twins' steps run in place on the worker (a limited step takes its slot in
the write that starts it), in the fan both cross the broker (fan members always do), so the ratio
is what a limit never reached costs where users meet it. Repetitions interleave the twins, and
the ratio compares medians from the same run: the goal is at most 1.3x per step. Writes bench/results/flow.json and flow.md and, when
writing there, the table between the ``bench:flow`` markers of docs/benchmarks.md. Its own database
``durable_flow`` (``BENCH_FLOW_DB``) and Redis db 6 (``BENCH_FLOW_REDIS``), so it can run beside
the other benchmarks.
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
from bench.stats import ratio, summary, wait_until  # noqa: E402

DB = os.environ.get("BENCH_FLOW_DB", "durable_flow")
REDIS = os.environ.get("BENCH_FLOW_REDIS", "redis://127.0.0.1:6379/6")
FAN = 100
POLL = 0.002
GOAL = 1.3
TERMINAL = ("completed", "failed", "cancelled", "dead")


def log(message: str) -> None:
    print(f"[flow {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def configure() -> None:
    env.DURABLE_DB = env.DBOS_DB = DB
    env.REDIS = REDIS
    env.ENV["DATABASE_URL"] = f"{env.PG}/{DB}"
    env.ENV["CELERY_BROKER_URL"] = REDIS


def flow_worker() -> env.Worker:
    """The suite's worker (prefork, same settings and flags), also importing the flow workloads."""
    worker = env.Worker("flow")
    argv = worker.process.argv
    argv[argv.index("bench.workloads")] = "bench.workloads,bench.flow_workloads"
    return worker


def once(workflow: str, payload: Any, expected: int) -> float:
    """Seconds from ``durable.start()`` until the run is seen completed."""
    import durable
    from durable.models import Run

    env.truncate()
    t0 = time.perf_counter()
    run_id = durable.start(workflow, payload).id

    def ended() -> str | None:
        status = Run.objects.filter(id=run_id).values_list("status", flat=True).first()
        return status if status in TERMINAL else None

    status = wait_until(ended, 300, POLL, f"run {run_id}")
    elapsed = time.perf_counter() - t0
    if status != "completed" or durable.result(run_id) != expected:
        raise RuntimeError(f"{workflow} ended {status}: {durable.get_run(run_id).error}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions of each twin")
    parser.add_argument("--out", type=Path, default=env.RESULTS, help="directory for flow.json / flow.md")
    args = parser.parse_args()
    started = time.perf_counter()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    configure()
    env.setup()
    import bench.flow_workloads as w

    source = env.source_hash(env.snapshot_dir)
    log(f"measuring the sources {source} copied to {env.snapshot_dir}; database {DB}, broker {REDIS}")
    seq_total = sum(range(w.STEPS))
    fan_total = sum(range(FAN))
    plan = {
        "seq_free": ("bench.flow_seq_free", None, seq_total, w.STEPS),
        "seq_limited": ("bench.flow_seq_limited", None, seq_total, w.STEPS),
        "fan_free": ("bench.flow_fan_free", FAN, fan_total, FAN),
        "fan_limited": ("bench.flow_fan_limited", FAN, fan_total, FAN),
        "seq_lane": ("bench.flow_seq_lane", None, seq_total, w.STEPS),
        "fan_lane": ("bench.flow_fan_lane", FAN, fan_total, FAN),
    }
    samples: dict[str, list[float]] = {name: [] for name in plan}
    worker = flow_worker()
    try:
        worker.start()
        log("warm-up: each twin twice")
        for _ in range(2):
            for workflow, payload, expected, _ in plan.values():
                once(workflow, payload, expected)
        for rep in range(args.reps):
            for name, (workflow, payload, expected, steps) in plan.items():
                samples[name].append(once(workflow, payload, expected) / steps)
            log(f"repetition {rep + 1}/{args.reps} done")
        worker_rss = worker.rss()
    finally:
        worker.stop()
    per_step = {name: summary(values, 6) for name, values in samples.items()}
    goals = {
        f"{kind}{twin}": {
            "value": ratio(per_step[f"{kind}_{limit}"]["median"], per_step[f"{kind}_free"]["median"]),
            "goal_max": GOAL,
        }
        for kind in ("seq", "fan")
        for twin, limit in (("", "limited"), ("_lane", "lane"))
    }
    data = {
        "meta": {
            "command": "bench/flow.py " + " ".join(sys.argv[1:]),
            "params": {"reps": args.reps, "fan": FAN, "steps": w.STEPS, "limit": w.NEVER_REACHED},
            "database": DB,
            "broker": REDIS,
            **env.run_meta(source, loadavg_start, started, worker_rss),
        },
        "results": {"seconds_per_step": per_step, "goals": goals},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / "flow.json", args.out / "flow.md"
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    md_path.write_text(markdown(data))
    log(f"wrote {json_path} and {md_path} in {data['meta']['total_s']} s")
    if args.out.resolve() == env.RESULTS.resolve() and report.update_tables("flow", markdown(data)):
        log(f"rewrote the flow table in {report.TABLES}")
    print(md_path.read_text())
    return 0


def markdown(data: dict[str, Any]) -> str:
    meta, results = data["meta"], data["results"]
    per_step, goals = results["seconds_per_step"], results["goals"]
    machine = meta["machine"]
    lines = [
        f"{meta['params']['reps']} interleaved repetitions, medians per step · "
        f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores · celery prefork, concurrency "
        f"{env.CONCURRENCY} · sources `{meta['source_hash'][:12]}`",
        "",
        "| workload | without a limit | `concurrency` never reached | ratio | a `Lane` of two steps, never reached | ratio | goal |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "seq": f"{meta['params']['steps']} steps in sequence",
        "fan": f"a fan of {meta['params']['fan']}",
    }
    for kind, label in names.items():
        free, limited = per_step[f"{kind}_free"]["median"], per_step[f"{kind}_limited"]["median"]
        lane = per_step[f"{kind}_lane"]["median"]
        value, shared = goals[kind]["value"], goals[f"{kind}_lane"]["value"]
        verdict = "met" if all(v is not None and v <= GOAL for v in (value, shared)) else "missed"
        lines.append(
            f"| {label} | {free * 1000:.2f} ms | {limited * 1000:.2f} ms | {value}x | {lane * 1000:.2f} ms "
            f"| {shared}x | <= {GOAL}x ({verdict}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
