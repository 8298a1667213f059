"""Profile the hot path once: ``.venv-bench/bin/python bench/profile.py [--runs 30]``.

Two views, written to bench/results/profile.md (plus the raw profiles beside it):

1. In-process, no broker (pyinstrument + a query timer): ``bench.dispatched10`` driven by a loop
   that runs durable's own messages (``durable.advance`` / ``durable.run_step``) in this process,
   and ``bench.local10`` through ``turn.advance``. Per turn and per step: wall time, SQL
   statements and their time, commits.
2. The real worker (py-spy, all pool processes): ``bench.dispatched10`` runs started at once,
   sampled while the worker drains them; the inclusive share of the frames that matter. The raw
   stacks go to the temporary directory (megabytes), not to results/.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402

_WRITING = re.compile(r"\b(?:INSERT INTO|UPDATE|DELETE FROM)\b")


class QueryTimer:
    """Times every SQL statement Django sends (``execute_wrapper``) and every commit, by phase."""

    def __init__(self) -> None:
        self.phase = "other"
        self.count: collections.Counter = collections.Counter()
        self.seconds: collections.Counter = collections.Counter()
        self.wall: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def __call__(self, execute, sql, params, many, context):
        match = re.search(r'"?((?:durable|django)_\w+)"?', sql)
        verb = sql.split(None, 1)[0].upper()
        key = (self.phase, f"{verb} {match.group(1) if match else '?'}")
        # A write outside any transaction commits by itself (autocommit): count it as a commit too,
        # a data-modifying WITH included.
        writes = verb in ("INSERT", "UPDATE", "DELETE") or (verb == "WITH" and _WRITING.search(sql))
        implicit = bool(writes) and not context["connection"].in_atomic_block
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.count[key] += 1
            self.seconds[key] += time.perf_counter() - t0
            if implicit:
                self.count[(self.phase, "(autocommit)")] += 1

    @contextlib.contextmanager
    def watch(self):
        from django.db import connection

        connection.ensure_connection()
        raw = connection.connection
        original = raw.commit

        def commit():
            t0 = time.perf_counter()
            try:
                return original()
            finally:
                key = (self.phase, "COMMIT")
                self.count[key] += 1
                self.seconds[key] += time.perf_counter() - t0

        raw.commit = commit
        try:
            with connection.execute_wrapper(self):
                yield self
        finally:
            raw.commit = original

    def timed(self, phase: str, fn):
        """Wrap ``fn`` so its wall time and statements count under ``phase`` (nesting excluded)."""

        def wrapper(*args):
            outer, self.phase = self.phase, phase
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.wall[phase] += time.perf_counter() - t0
                self.calls[phase] += 1
                self.phase = outer
                if outer != "other":
                    self.wall[outer] -= time.perf_counter() - t0  # the outer phase's own time only

        return wrapper

    def summary(self, phase: str) -> str:
        calls = self.calls[phase] or 1
        stmts = {k[1]: n for k, n in self.count.items() if k[0] == phase}
        secs = {k[1]: t for k, t in self.seconds.items() if k[0] == phase}
        sql = sum(secs.values())
        statements = sum(n for k, n in stmts.items() if k not in ("COMMIT", "(autocommit)"))
        return (
            f"{self.wall[phase] * 1000 / calls:.2f} ms wall, of which {sql * 1000 / calls:.2f} ms in SQL and "
            f"commits ({statements / calls:.1f} statements, {stmts.get('COMMIT', 0) / calls:.1f} explicit "
            f"commits + {stmts.get('(autocommit)', 0) / calls:.1f} autocommitted writes)"
        )

    def table(self, phase: str) -> list[str]:
        calls = self.calls[phase] or 1
        lines = [f"| {phase}: statement | per {phase} | ms per {phase} |", "| --- | --- | --- |"]
        for (ph, key), n in sorted(self.count.items(), key=lambda kv: -self.seconds[kv[0]]):
            if ph == phase and key != "(autocommit)":
                lines.append(f"| {key} | {n / calls:.2f} | {self.seconds[(ph, key)] * 1000 / calls:.3f} |")
        return lines


def in_process(runs: int, out: Path) -> list[str]:
    from pyinstrument import Profiler

    import durable
    from durable import dispatch
    from durable.engine import steps, turn

    queue: list = []
    transport = dispatch.Transport(send=queue.append, served_queues=None)  # None: run the next turn inline
    saved = dispatch.install(transport), turn.advance
    timer = QueryTimer()
    # steps.run_step calls turn.advance through the module, so the wrapped one times inline turns.
    turn.advance = timer.timed("turn", saved[1])
    handlers = {dispatch.ADVANCE: turn.advance, dispatch.RUN_STEP: timer.timed("step", steps.run_step)}

    def drive(workflow: str) -> None:
        durable.start(workflow)
        while queue:
            message = queue.pop(0)
            handlers[message.task](*message.args)

    def measure(workflow: str) -> float:
        env.truncate()
        for _ in range(3):
            drive(workflow)
        env.truncate()
        timer.__init__()
        with timer.watch():
            t0 = time.perf_counter()
            for _ in range(runs):
                drive(workflow)
            return (time.perf_counter() - t0) / runs

    def profile(workflow: str, label: str) -> None:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(runs):
            drive(workflow)
        profiler.stop()
        text = profiler.output_text(unicode=False, color=False, show_all=False, timeline=False)
        # Paths relative to the repository: the report names no directory of the machine it ran on.
        (out / f"profile-{label}.txt").write_text(text.replace(f"{env.ROOT}/", ""))

    lines: list[str] = []
    try:
        # A worker of the steps' queue runs them in place, inside the turn (EAGER_STEPS).
        transport.served_queues = {"durable", "celery"}
        per_run = measure("bench.dispatched10")
        lines += [
            f"### Dispatched steps run in place (a worker of their queue): `bench.dispatched10`, {runs} runs",
            "",
            f"{per_run * 1000:.1f} ms per run; {timer.calls['turn'] / runs:.0f} turns per run.",
            "",
            f"- per turn (`durable.advance`, the ten steps included): {timer.summary('turn')}",
            "",
            *timer.table("turn"),
            "",
        ]
        profile("bench.dispatched10", "in-place")
        transport.served_queues = None  # every step through a message, the next turn inline
        per_run = measure("bench.dispatched10")
        lines += [
            f"### Dispatched steps through the broker: `bench.dispatched10`, {runs} runs, messages handed over in-process",
            "",
            f"{per_run * 1000:.1f} ms per run; {timer.calls['turn'] / runs:.0f} turns and "
            f"{timer.calls['step'] / runs:.0f} step tasks per run.",
            "",
            f"- per turn (`durable.advance`): {timer.summary('turn')}",
            f"- per dispatched step (`durable.run_step`, its inline next turn excluded): {timer.summary('step')}",
            "",
            *timer.table("turn"),
            "",
            *timer.table("step"),
            "",
            "pyinstrument call trees: `profile-in-place.txt`, `profile-dispatched.txt`.",
            "",
        ]
        profile("bench.dispatched10", "dispatched")
        one = measure("bench.local1")
        one_turn = timer.summary("turn")
        ten = measure("bench.local10")
        step = (ten - one) / 9
        lines += [
            f"### Local steps in-process: `bench.local1` vs `bench.local10`, {runs} runs each",
            "",
            f"{one * 1000:.2f} ms per 1-step run, {ten * 1000:.2f} ms per 10-step run: a local step costs "
            f"{step * 1000:.2f} ms, the rest of a turn {(one - step) * 1000:.2f} ms.",
            "",
            f"- one turn of `bench.local1`: {one_turn}",
            f"- one turn of `bench.local10`: {timer.summary('turn')}",
            "",
            *timer.table("turn"),
            "",
            "pyinstrument call tree: `profile-local.txt`.",
            "",
        ]
        profile("bench.local10", "local")
    finally:
        dispatch.install(saved[0])
        turn.advance = saved[1]
    return lines


#: Frames whose inclusive share of the worker's samples the report gives (substring of a frame).
FRAMES = {
    "durable run_step task (durable/engine/steps.py run_step)": "run_step (durable/engine/steps.py",
    "durable turn (durable/engine/turn.py advance)": "advance (durable/engine/turn.py",
    "  of which replay of the workflow body": "replay (durable/replay/core.py",
    "opening a PostgreSQL connection (psycopg connect)": "connect (psycopg/connection.py",
    "closing it (Celery's Django fix-up, per task)": "_close_database (celery/fixups/django.py",
    "SQL execute (psycopg cursor.execute)": "execute (psycopg/cursor.py",
    "commit (psycopg commit)": "commit (psycopg/connection.py",
    "publishing to Redis (kombu Producer.publish)": "publish (kombu/messaging.py",
    "Celery's own task machinery (trace_task)": "trace_task (celery/app/trace.py",
}


def worker(runs: int, out: Path) -> list[str]:
    from bench import dispatched

    raw = Path(tempfile.gettempdir()) / "durable-bench-profile-worker.txt"  # megabytes: kept out of results/
    raw.unlink(missing_ok=True)
    # py-spy starts the worker itself (attaching to a running process fails on this machine) and
    # writes its samples when it gets SIGINT.
    # --idle: count threads waiting on PostgreSQL or Redis too, so the shares are of wall time (without
    # it, what py-spy counts as waiting depends on how busy the machine is).
    spy = [
        str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--subprocesses",
        "--idle",
        "--rate",
        "250",
        "--format",
        "raw",
        "--output",
        str(raw),
        "--",
    ]
    w = env.Worker("profile", wrap=spy).start()
    try:
        env.truncate()
        result = dispatched.durable_many("bench.dispatched10", runs)
        os.kill(w.pid(), signal.SIGINT)
        for _ in range(300):
            if raw.exists() and raw.stat().st_size:
                break
            time.sleep(0.1)
        time.sleep(1)
    finally:
        w.stop()
    stacks = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        stacks[stack] += int(count)
    pool = {s: n for s, n in stacks.items() if "trace_task (celery/app/trace.py" in s}
    total = sum(pool.values()) or 1
    lines = [
        f"### The worker, {runs} `bench.dispatched10` runs at once ({result['total_s']:.1f} s, "
        f"{runs / result['total_s']:.1f} runs/s)",
        "",
        f"py-spy samples (wall clock, idle included) inside Celery's task execution in the pool children: "
        f"{total}. Inclusive shares of the task time:",
        "",
        "| frame | share of task time |",
        "| --- | --- |",
    ]
    for label, needle in FRAMES.items():
        n = sum(c for s, c in pool.items() if needle in s)
        lines.append(f"| {label} | {n / total:.0%} |")
    selfs = collections.Counter()
    for s, c in pool.items():
        selfs[s.split(";")[-1]] += c
    lines += [
        "",
        "Top self time (leaf frames) in task execution:",
        "",
        "| leaf frame | share |",
        "| --- | --- |",
    ]
    for frame, c in selfs.most_common(12):
        lines.append(f"| `{frame.strip()}` | {c / total:.1%} |")
    lines += [
        "",
        f"Raw collapsed stacks (py-spy `--format raw`): `{raw.name}` in the temporary directory.",
        "",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30, help="runs per in-process profile")
    parser.add_argument(
        "--worker-runs", type=int, default=200, help="runs drained while py-spy samples the worker"
    )
    args = parser.parse_args()
    env.setup()
    out = env.RESULTS
    lines = [
        f"# Hot-path profile (sources `{env.source_hash(env.snapshot_dir)}`, settings "
        f"`{env.ENV['DJANGO_SETTINGS_MODULE']}`)",
        "",
    ]
    lines += in_process(args.runs, out)
    lines += worker(args.worker_runs, out)
    env.truncate()
    (out / "profile.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
