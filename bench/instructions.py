"""What a change costs in Python, counted in instructions rather than timed: the in-process
ten-local-step run (``bench.local10``, the path where durable's own Python weighs most) of this
checkout against the sources of another commit.

    .venv-bench/bin/python bench/instructions.py --against f04b883^1   # about two minutes
    .venv-bench/bin/python bench/instructions.py --metrics both        # metrics off, then on

With ``--metrics MODE`` both sides are this checkout's sources, the first with metrics ``off``, the
second as MODE says (``prometheus``, ``otel`` or ``both``: see bench/metering.py).

Each side runs in its own process under valgrind's callgrind (Debian's ``valgrind`` package),
collecting only while ``--runs`` runs start and finish (after ten unmeasured ones): the count of
instructions the CPU executed for them in the bench process, the same from one run to the next
within a fraction of a percent, and blind to whatever else the machine is doing. What the database
server does is not counted (the same statements on both sides show the same there; a change in
statements shows in ``bench/run.py`` and ``tests/integration/test_costs.py``). Timed figures need
a quiet machine; this one does not, which is why it exists.

Writes bench/results/instructions.json and instructions.md. Databases ``durable_instr_a`` and
``durable_instr_b`` only (``BENCH_INSTR_DBS=one,two`` names others: each is dropped first).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGES = ("durable", "durable_admin", "project")
DBS = tuple(os.environ.get("BENCH_INSTR_DBS", "durable_instr_a,durable_instr_b").split(","))
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def log(message: str) -> None:
    print(f"[instructions {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _callgrind(switch: str) -> None:
    subprocess.run(["callgrind_control", "-i", switch, str(os.getpid())], check=True, capture_output=True)


def measure(runs: int) -> None:
    """In the process valgrind runs: set up, warm up, then count ``runs`` runs."""
    from dataclasses import replace

    from bench import env

    env.setup()  # first: what imports durable after it imports the sources being measured
    from bench import local
    from durable import dispatch

    if not dispatch.__file__.startswith(os.environ["BENCH_SOURCE"]):
        raise RuntimeError(f"durable was imported from {dispatch.__file__}, not from the sources measured")

    dispatch.install(replace(dispatch.transport, send=lambda message: None))
    if os.environ.get("BENCH_METRICS"):  # only sources that have durable.metrics are asked this
        from bench import metering

        metering.apply(os.environ["BENCH_METRICS"])
    env.truncate()
    for _ in range(10):
        local._in_process_once()
    _callgrind("on")
    for _ in range(runs):
        local._in_process_once()
    _callgrind("off")


def _sources(rev: str | None, into: Path) -> Path:
    """The packages of ``rev`` (the working tree when None), copied to ``into``."""
    into.mkdir(parents=True)
    if rev is None:
        for package in PACKAGES:
            shutil.copytree(ROOT / package, into / package, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(
            ["git", "archive", rev, *PACKAGES], cwd=ROOT, check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(into, filter="data")
    return into


def _fresh(db: str) -> None:
    """Drop ``db``: each side migrates its own, as its sources' schema has it."""
    import psycopg

    from bench.env import PG

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def _count(source: Path, db: str, runs: int, metrics: str | None = None) -> int:
    _fresh(db)
    environ = {**os.environ, "BENCH_SOURCE": str(source), "BENCH_DB": db, "PYTHONHASHSEED": "0"}
    if metrics is not None:
        environ["BENCH_METRICS"] = metrics
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={source}/callgrind.out",
            sys.executable,
            __file__,
            "--measure",
            str(runs),
        ],
        env=environ,
        capture_output=True,
        text=True,
    )
    found = COLLECTED.search(done.stderr)
    if done.returncode or not found:
        raise RuntimeError(f"the measured process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--against", default="f04b883^1", help="the commit to compare with (default: before values)"
    )
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument(
        "--metrics",
        choices=("prometheus", "otel", "both"),
        help="compare this checkout with metrics off against the same with these metrics on",
    )
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        measure(args.measure)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    here = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(["git", "status", "--porcelain", *PACKAGES], cwd=ROOT, capture_output=True).stdout
    )
    sources = here + ("+changes" if dirty else "")
    if args.metrics:
        against = f"{sources}, metrics off"
        sides = (("before", None, DBS[0], "off"), ("now", None, DBS[1], args.metrics))
        sources = f"{sources}, metrics {args.metrics}"
    else:
        against = subprocess.run(
            ["git", "rev-parse", "--short=12", args.against],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        sides = (("before", against, DBS[0], None), ("now", None, DBS[1], None))
    with tempfile.TemporaryDirectory(prefix="durable-instr-") as tmp:
        counts = {}
        for side, rev, db, metrics in sides:
            log(f"{side}: counting {args.runs} runs" + (f", metrics {metrics}" if metrics else ""))
            counts[side] = _count(_sources(rev, Path(tmp) / side), db, args.runs, metrics) / args.runs
    result = {
        "against": against,
        "sources": sources,
        "runs": args.runs,
        "per_run": counts,
        "ratio": round(counts["now"] / counts["before"], 4),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "instructions.json").write_text(json.dumps(result, indent=2) + "\n")
    table = (
        f"Instructions per in-process ten-local-step run (`bench.local10`), {args.runs} runs counted by "
        f"callgrind, sources `{result['sources']}` against `{against}`:\n\n"
        "| sources | instructions per run | ratio |\n| --- | --- | --- |\n"
        f"| `{against}` | {counts['before'] / 1e6:.2f} M | 1.0x |\n"
        f"| `{result['sources']}` | {counts['now'] / 1e6:.2f} M | {result['ratio']:.3f}x |\n"
    )
    (out / "instructions.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
