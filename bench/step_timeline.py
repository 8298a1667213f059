"""Where a step through the broker spends its time: durable's ``bench.dispatched10`` on a worker
with EAGER_STEPS off (every step crosses the broker) beside the Celery chain of ten on the same
worker, one run at a time, interleaved.

    .venv-bench/bin/python bench/step_timeline.py       # 30 of each, ~1 min

The worker notes Celery's own signals in each of its processes (``bench/timeline_signals.py``):
a task received by the consumer, started in a pool process, publishing its successor, ended.
Per step, the medians of: started → published (the task's own work up to its successor's
message: for durable the take, the body, the result written with the next turn and the
publish; for the chain the publish alone), published → received (the broker) and received →
started (the pool), and started → the next step started. Writes bench/results/step_timeline.json
and step_timeline.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402
from bench.dispatched import chain_once, durable_once  # noqa: E402

SPANS = {
    "started → published": ("started", "published"),
    "published → received": ("published", "received"),
    "received → started": ("received", "started"),
}


def events(directory: Path) -> list[tuple[int, int, str, str]]:
    found = []
    for path in directory.glob("*.log"):
        for line in path.read_text().splitlines():
            at, pid, event, task = line.split()
            found.append((int(at), int(pid), event, task))
    return sorted(found)


def steps(noted: list[tuple[int, int, str, str]], windows: list[tuple[int, int]]) -> dict[str, list[float]]:
    """Per step of the runs inside ``windows``: milliseconds of each span, and from one step's
    start to the next's."""
    spans: dict[str, list[float]] = {name: [] for name in [*SPANS, "step (started → next started)"]}
    for began, ended in windows:
        inside = [e for e in noted if began <= e[0] <= ended]
        starts = [e for e in inside if e[2] == "started"]
        for start, following in zip(starts, [*starts[1:], None], strict=True):
            if following is not None:
                spans["step (started → next started)"].append((following[0] - start[0]) / 1e6)
            # Its own successor's message: published by the same process before it ended.
            published = next(
                (e for e in inside if e[2] == "published" and e[1] == start[1] and e[0] > start[0]), None
            )
            received = published and next(
                (e for e in inside if e[2] == "received" and e[0] > published[0]), None
            )
            if published is None or received is None or following is None or following[0] < received[0]:
                continue
            spans["started → published"].append((published[0] - start[0]) / 1e6)
            spans["published → received"].append((received[0] - published[0]) / 1e6)
            spans["received → started"].append((following[0] - received[0]) / 1e6)
    return spans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    env.setup()
    noted = Path(tempfile.mkdtemp(prefix="durable-bench-timeline-"))
    worker = env.Worker(
        name="timeline",
        settings={"DURABLE_EAGER_STEPS": "0", "BENCH_TIMELINE_DIR": str(noted)},
    )
    argv = worker.process.argv
    argv[argv.index("bench.workloads")] = "bench.workloads,bench.timeline_signals"
    worker.start()
    windows: dict[str, list[tuple[int, int]]] = {"durable": [], "chain": []}
    wall: dict[str, list[float]] = {"durable": [], "chain": []}
    try:
        env.truncate()
        for _ in range(5):  # warm-up: imports, connections, both pool processes
            durable_once("bench.dispatched10"), chain_once()
        for _ in range(args.runs):
            for name, once in (
                ("durable", lambda: durable_once("bench.dispatched10")),
                ("chain", chain_once),
            ):
                began = time.time_ns()
                wall[name].append(once())
                windows[name].append((began, time.time_ns()))
    finally:
        worker.stop()
    noted_events = events(noted)
    results = {
        name: {
            "run_ms": round(statistics.median(wall[name]) * 1000, 2),
            **{
                span: {"median_ms": round(statistics.median(values), 3), "n": len(values)}
                for span, values in steps(noted_events, windows[name]).items()
                if values
            },
        }
        for name in windows
    }
    data = {"machine": env.machine(), "runs": args.runs, "results": results}
    md = markdown(data)
    env.RESULTS.mkdir(parents=True, exist_ok=True)
    (env.RESULTS / "step_timeline.json").write_text(json.dumps(data, indent=2) + "\n")
    (env.RESULTS / "step_timeline.md").write_text(md)
    print(md)
    return 0


def markdown(data: dict[str, Any]) -> str:
    m, r = data["machine"], data["results"]
    d, c = r["durable"], r["chain"]
    lines = [
        f"{m.get('date', '')} · {m.get('cpu', '?')}, {m.get('cores', '?')} cores · {data['runs']} runs of each, "
        "one at a time, interleaved · `bench.dispatched10` with EAGER_STEPS off vs the Celery chain of ten, "
        "same prefork -c 2 worker",
        "",
        "| per step, median | durable | chain | durable − chain |",
        "| --- | ---: | ---: | ---: |",
    ]
    for span in [*SPANS, "step (started → next started)"]:
        lines.append(
            f"| {span} | {d[span]['median_ms']:.2f} ms | {c[span]['median_ms']:.2f} ms | "
            f"{d[span]['median_ms'] - c[span]['median_ms']:+.2f} ms |"
        )
    lines += [
        f"| a whole run, start to seen done | {d['run_ms']:.1f} ms | {c['run_ms']:.1f} ms | "
        f"{d['run_ms'] - c['run_ms']:+.1f} ms |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
