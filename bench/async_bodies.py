"""What an ``async def`` body costs against a plain one: the ten-local-step family.

    .venv-bench/bin/python bench/async_bodies.py      # under a minute

Each figure is a run started with ``durable.start()`` and its turn run in this process
(``durable.engine.turn.advance``, as ``local.in_process`` does): ``bench.local10`` (a plain
body) against ``bench.alocal10`` (the same ten local steps, awaited in an ``async def`` body).
They are measured in alternation (a few runs of each, again and again), so a machine whose speed
drifts weighs on both alike, and reported as the ratio of the medians. Goal: at most 1.2x.

Writes bench/results/async_bodies.json and async_bodies.md. Uses the database given by
``BENCH_ASYNC_DB`` (default ``durable_abodies``) only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402
from bench.payloads import _alternate, _once, _truncate  # noqa: E402
from bench.stats import ratio, summary  # noqa: E402

DB = os.environ.get("BENCH_ASYNC_DB", "durable_abodies")


def measure(rounds: int, per_round: int) -> dict[str, Any]:
    from bench.async_body_workloads import ALOCAL10
    from durable import dispatch

    saved = dispatch.install(replace(dispatch.transport, send=lambda message: None))
    try:
        variants = {"sync": lambda: _once("bench.local10", None), "async": lambda: _once(ALOCAL10, None)}
        for once in variants.values():
            for _ in range(5):  # warm: imports, prepared statements
                once()
        samples = _alternate(variants, rounds, per_round)
    finally:
        dispatch.install(saved)
    return {name: summary(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20, help="alternations of the variants (default 20)")
    parser.add_argument("--per-round", type=int, default=10, help="runs of each per round (default 10)")
    parser.add_argument("--out", type=Path, default=env.RESULTS, help="directory for async_bodies.json / .md")
    args = parser.parse_args()
    env.DURABLE_DB = env.DBOS_DB = DB
    env.ENV["DATABASE_URL"] = f"{env.PG}/{DB}"
    env.ENV["CELERY_BROKER_URL"] = os.environ.get("BENCH_ASYNC_REDIS", "redis://127.0.0.1:6379/10")
    loadavg = [round(x, 2) for x in os.getloadavg()]
    env.setup()
    _truncate()
    figures = measure(args.rounds, args.per_round)
    sync, async_ = figures["sync"]["median"], figures["async"]["median"]
    result = {
        "loadavg_start": loadavg,
        "rounds": args.rounds,
        "per_round": args.per_round,
        "figures": figures,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_bodies.json").write_text(json.dumps(result, indent=2) + "\n")
    md = (
        "# Async bodies\n\n"
        f"Load average {loadavg} at the start; {args.rounds} rounds of {args.per_round} runs of each.\n\n"
        "| ten local steps, turn run in this process | median per run | vs plain body |\n"
        "| --- | --- | --- |\n"
        f"| plain `def` body (`bench.local10`) | {sync * 1000:.2f} ms | 1.0x |\n"
        f"| `async def` body (`bench.alocal10`) | {async_ * 1000:.2f} ms | {ratio(async_, sync)}x |\n"
    )
    (args.out / "async_bodies.md").write_text(md)
    print(md)
    print(f"[async bodies {time.strftime('%H:%M:%S')}] done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
