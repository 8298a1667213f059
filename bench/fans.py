"""The fan benchmarks: ``ctx.map`` over N dispatched no-op steps, and against a Celery chord.

    .venv-bench/bin/python bench/fans.py          # N = 10, 100, 1,000, 10,000; under 10 minutes

Writes bench/results/fans.json (every sample) and bench/results/fans.md (the tables). See the
"Fans" section of bench/README.md. It reuses the suite's helpers (``env`` for the snapshot,
services, worker subprocess and machine facts, ``stats`` for medians and repetitions) but its
own services: the PostgreSQL database ``durable_fans`` and Redis db 7, so it can run beside the
main suite.
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
from bench.report import _ms, _verdict  # noqa: E402
from bench.stats import Reps, ratio, summary, wait_until  # noqa: E402

DB = os.environ.get("BENCH_FANS_DB", "durable_fans")
REDIS = os.environ.get("BENCH_FANS_REDIS", "redis://127.0.0.1:6379/7")
#: Tables a chord on the django-db result backend adds to the suite's ``env.TABLES``.
CHORD_TABLES = ("django_celery_results_chordcounter", "django_celery_results_groupresult")

SIZES = (10, 100, 1000, 10_000)
BIG = 10_000
#: The fan the big one's time per step is compared with, and how many of it bracket each big
#: repetition (run just before and just after it), so that a ratio can pair figures taken minutes
#: apart on a machine whose speed drifts.
PAIR, BRACKET = 100, 3
CHORD_N = 1000
POLL = 0.002  # seconds between two looks at the chord's result row (as dispatched.py does)
DEFAULT_BUDGET = 540.0  # seconds for the whole command, start-up included: under 10 minutes
RESERVE = 25.0  # seconds kept back for stopping the worker and writing the report
executed = {"members": 0}  # fan members run by the worker, for index entries read per member


def log(message: str) -> None:
    print(f"[fans {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def configure() -> None:
    """Point the suite's environment at this benchmark's database and Redis db, before setup()."""
    env.DURABLE_DB = env.DBOS_DB = DB  # setup() creates and migrates only this one
    env.REDIS = REDIS
    env.ENV["DATABASE_URL"] = f"{env.PG}/{DB}"
    env.ENV["CELERY_BROKER_URL"] = REDIS


def start_worker() -> env.Worker:
    """The suite's worker (prefork, same settings and flags), also importing the fan workloads."""
    worker = env.Worker("fans")
    argv = worker.process.argv
    argv[argv.index("bench.workloads")] = "bench.workloads,bench.fan_workloads"
    return worker.start()


def truncate() -> None:
    from django.db import connection

    env.truncate()
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(CHORD_TABLES)} RESTART IDENTITY CASCADE")


def _since(moment: Any, origin: float) -> float | None:
    return None if moment is None else round(moment.timestamp() - origin, 4)


class QueueDepth:
    """Samples the length of the ``durable`` queue in Redis every 5 ms while a fan runs.

    The first turn sends the N step messages one by one after its commit, faster than two pool
    processes run them, so the queue is at its deepest when the last one has been sent: the
    moment of the peak (to within the sampling period) is when dispatch ended.
    """

    def __init__(self, origin: float, period: float = 0.005) -> None:
        import threading

        import redis

        self.client = redis.Redis.from_url(REDIS)
        self.origin, self.period = origin, period
        self.peak, self.peak_at = 0, None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stopped.is_set():
            depth = self.client.llen("durable")
            if depth > self.peak:
                self.peak, self.peak_at = depth, round(time.time() - self.origin, 4)
            self.stopped.wait(self.period)

    def __enter__(self) -> QueueDepth:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.client.close()


# -- durable ------------------------------------------------------------------------------------


def fan_once(n: int, timeout: float) -> dict[str, Any]:
    """One fan of ``n``: wall seconds from ``durable.start()`` to ``durable.result()`` returning,
    plus where the time went, read back from the run's rows (same machine, same clock)."""
    import durable
    from durable.errors import WaitTimeout

    truncate()
    origin = time.time()
    t0 = time.perf_counter()
    with QueueDepth(origin) as depth:
        run_id = durable.start("bench.fan", n).id
        sent = time.perf_counter() - t0
        try:
            value = durable.result(run_id, timeout=timeout)
        except WaitTimeout:
            value = None
        elapsed = time.perf_counter() - t0
    rows = _fan_rows(run_id, origin)
    rows["queue_peak_depth"], rows["queue_peak_at"] = depth.peak, depth.peak_at
    executed["members"] += rows["started"]
    if value is None:
        durable.cancel(run_id, reason="bench time budget")
        env.purge_queues()
        return {"n": n, "finished": False, "elapsed_s": round(elapsed, 4), "rows": rows}
    if value != n * (n - 1) // 2:
        raise RuntimeError(f"fan of {n} returned {value!r}, not {n * (n - 1) // 2}")
    return {
        "n": n,
        "finished": True,
        "wall_s": round(elapsed, 4),
        "start_s": round(sent, 4),
        "finished_s": rows["run_finished"],
        "rows": rows,
        "phases": _phases(rows, elapsed),
    }


def _fan_rows(run_id: str, origin: float) -> dict[str, Any]:
    """Timestamps of the run and its fan members, in seconds since start() was called."""
    from django.db.models import Count, Max, Min, Q

    from durable.models import Checkpoint, Run

    run = Run.objects.get(id=run_id)
    agg = Checkpoint.objects.filter(run_id=run_id, fan__isnull=False).aggregate(
        members=Count("id"),
        completed=Count("id", filter=Q(status="completed")),
        started=Count("id", filter=Q(started_at__isnull=False)),
        attempts_over_1=Count("id", filter=Q(attempt__gt=1)),
        first_recorded=Min("enqueued_at"),
        last_recorded=Max("enqueued_at"),
        first_started=Min("started_at"),
        last_started=Max("started_at"),
        first_finished=Min("finished_at"),
        last_finished=Max("finished_at"),
    )
    out = {
        "status": run.status,
        "wakes": run.wakes,
        "run_created": _since(run.created_at, origin),
        "first_turn": _since(run.started_at, origin),
        "run_finished": _since(run.finished_at, origin),
    }
    for key, value in agg.items():
        out[key] = value if isinstance(value, int) else _since(value, origin)
    return out


#: A finished fan's timeline, seconds since start() was called (see ``_phases``).
TIMELINE = (
    "first_turn",
    "last_recorded",
    "first_started",
    "queue_peak_at",
    "last_finished",
    "run_finished",
    "result",
)


def _phases(r: dict[str, Any], wall: float) -> dict[str, float | None]:
    """Where a finished fan's time went, as a timeline in seconds since start() was called:

    first_turn      a worker claims the run for its first turn
    last_recorded   the first turn's body has recorded the N positions (last enqueued_at)
    first_started   the first member starts on a worker: after the bulk INSERT of N rows, the
                    commit and the first message
    queue_peak_at   the durable queue is at its deepest: the first turn has sent all N messages
                    (None when too short to see)
    last_finished   the last member's result is recorded
    run_finished    the run completed: the fan-closed check, the join turn (load N rows, replay)
                    and its settle
    result          durable.result() returned (its back-off poll)
    """
    return {**{k: r[k] for k in TIMELINE[:-1]}, "result": round(wall, 4)}


# -- the Celery peer ----------------------------------------------------------------------------


def chord_once(n: int, timeout: float) -> dict[str, Any]:
    """One chord of ``n``: wall seconds from ``apply_async()`` until its callback's result row is
    SUCCESS (polled every 2 ms), and when its rows say things happened."""
    from django.db.models import Max, Min
    from django_celery_results.models import TaskResult

    from bench import fan_workloads

    truncate()
    origin = time.time()
    t0 = time.perf_counter()
    result = fan_workloads.celery_chord(n).apply_async()
    sent = time.perf_counter() - t0
    wait_until(
        lambda: TaskResult.objects.filter(task_id=result.id, status="SUCCESS").exists(),
        timeout,
        POLL,
        f"chord of {n}",
    )
    elapsed = time.perf_counter() - t0
    value = result.get(timeout=10)
    if value != n * (n - 1) // 2:
        raise RuntimeError(f"chord of {n} returned {value!r}, not {n * (n - 1) // 2}")
    header = TaskResult.objects.exclude(task_id=result.id).aggregate(
        first_done=Min("date_done"), last_done=Max("date_done")
    )
    callback = TaskResult.objects.get(task_id=result.id)
    rows = {
        "header_results": TaskResult.objects.exclude(task_id=result.id).count(),
        "first_header_done": _since(header["first_done"], origin),
        "last_header_done": _since(header["last_done"], origin),
        "callback_done": _since(callback.date_done, origin),
    }
    return {
        "n": n,
        "wall_s": round(elapsed, 4),
        "send_s": round(sent, 4),
        "finished_s": rows["callback_done"],
        "rows": rows,
    }


# -- the run ------------------------------------------------------------------------------------


def small_rep(sizes: list[int], samples: dict[int, list], chords: list, timeout: float) -> None:
    """One repetition of every fan of N <= 1,000 and of the chord, interleaved."""
    for n in sizes:
        samples[n].append(fan_once(n, timeout))
        if n == CHORD_N:
            chords.append(chord_once(CHORD_N, timeout))
    if CHORD_N not in sizes:
        chords.append(chord_once(CHORD_N, timeout))


def big_rep(n: int, timeout: float) -> dict[str, Any]:
    """One fan of ``n``, bracketed by fans of ``PAIR`` run just before and just after it."""
    before = [fan_once(PAIR, 60) for _ in range(BRACKET)]
    reads = index_reads()
    sample = fan_once(n, timeout)
    after = [fan_once(PAIR, 60) for _ in range(BRACKET)]
    # Approximate: the worker's connections report statistics about once a second while busy, and
    # the fans of 100 after it add a few hundred members' worth.
    total = lambda r: sum(i["read"] for i in r["indexes"].values())  # noqa: E731
    sample["index_entries_read_per_member"] = round((total(index_reads()) - total(reads)) / n, 1)
    bracket = summary([r["wall_s"] for r in before + after])
    sample["bracket"] = {
        "n": PAIR,
        "wall_s": bracket,
        "per_step_ms": round(bracket["median"] / PAIR * 1000, 4),
    }
    if sample["finished"]:
        sample["paired_ratio"] = ratio(sample["wall_s"] / n * 1000, sample["bracket"]["per_step_ms"])
    return sample


def index_reads() -> dict[str, Any]:
    """Cumulative scans and entries read of each index of durable_checkpoint, and autovacuum.

    The worker's connections report theirs when they close, so read this before the worker
    starts and after it stopped.
    """
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        # The history is partitioned by day: each partition's index counted under its parent's.
        cur.execute(
            "SELECT coalesce(parent.relname, s.indexrelname) AS name, sum(s.idx_scan), sum(s.idx_tup_read) "
            "FROM pg_stat_user_indexes s LEFT JOIN pg_inherits i ON i.inhrelid = s.indexrelid "
            "LEFT JOIN pg_class parent ON parent.oid = i.inhparent "
            "WHERE s.relname LIKE 'durable\\_checkpoint%' GROUP BY 1 ORDER BY 1"
        )
        found = {name: {"scans": int(scans), "read": int(read)} for name, scans, read in cur.fetchall()}
        cur.execute("SHOW autovacuum")
        autovacuum = cur.fetchone()[0]
    return {"indexes": found, "autovacuum": autovacuum}


def index_usage(before: dict[str, Any], after: dict[str, Any], members: int) -> dict[str, Any]:
    """Index entries read per fan member executed, by index, over the measured part."""
    usage = {}
    for name, a in after["indexes"].items():
        b = before["indexes"].get(name, {"scans": 0, "read": 0})
        scans, read = a["scans"] - b["scans"], a["read"] - b["read"]
        usage[name] = {
            "scans": scans,
            "entries_read": read,
            "entries_read_per_member": round(read / members, 1) if members else None,
        }
    return {
        "members": members,
        "autovacuum": after["autovacuum"],
        "by_index": usage,
        "entries_read_per_member": round(sum(u["entries_read"] for u in usage.values()) / members, 1)
        if members
        else None,
    }


def fan_summary(n: int, runs: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    done = [r for r in runs if r["finished"]]
    out: dict[str, Any] = {"n": n, "reps": info, "samples": runs}
    if not done:
        out["unfinished"] = runs
        return out
    wall = summary([r["wall_s"] for r in done])
    server = summary([r["finished_s"] for r in done])
    out.update(
        {
            "wall_s": wall,
            "per_step_ms": round(wall["median"] / n * 1000, 4),
            "finished_s": server,
            "per_step_finished_ms": round(server["median"] / n * 1000, 4),
            "steps_per_s": round(n / wall["median"], 1),
            "timeline_median_s": {
                k: (
                    summary(values)["median"]
                    if (values := [r["phases"][k] for r in done if r["phases"][k] is not None])
                    else None
                )
                for k in TIMELINE
            },
        }
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="fan sizes (default 10,100,1000,10000)"
    )
    parser.add_argument(
        "--reps", type=int, default=5, help="repetitions planned for N <= 1,000 and the chord"
    )
    parser.add_argument("--min-reps", type=int, default=3, help="repetitions always run for N <= 1,000")
    parser.add_argument("--big-reps", type=int, default=3, help=f"repetitions planned for N = {BIG:,}")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        help="seconds for the whole command; extra repetitions stop before overrunning it",
    )
    parser.add_argument("--out", type=Path, default=env.RESULTS, help="directory for fans.json / fans.md")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    small = [n for n in sizes if n <= CHORD_N]
    big = [n for n in sizes if n > CHORD_N]

    started = time.perf_counter()
    deadline = started + args.budget - RESERVE

    def left() -> float:
        return deadline - time.perf_counter()

    loads: dict[str, float] = {}
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    configure()
    env.setup()
    import bench.fan_workloads  # noqa: F401 - registers bench.fan in this process too

    source = env.source_hash(env.snapshot_dir)
    log(f"measuring the sources {source} copied to {env.snapshot_dir}; database {DB}, broker {REDIS}")
    samples: dict[int, list] = {n: [] for n in sizes}
    chords: list[dict[str, Any]] = []
    infos: dict[str, dict[str, Any]] = {}
    phase_s: dict[str, float] = {}
    reads_before = index_reads()
    worker = start_worker()
    try:
        log("warm-up: a fan of 10 and a chord of 10, twice")
        for _ in range(2):
            fan_once(10, 60)
            chord_once(10, 60)
        t = time.perf_counter()
        log(
            f"N <= {CHORD_N:,}: {args.min_reps} repetitions of fans {small} and the chord of {CHORD_N:,}, interleaved"
        )
        for _ in range(args.min_reps):
            small_rep(small, samples, chords, min(300, max(left(), 30)))
        phase_s["small"] = round(time.perf_counter() - t, 1)
        loads["small"] = round(os.getloadavg()[0], 2)
        log(
            f"... {phase_s['small']} s; fan medians: "
            + ", ".join(f"{n}: {summary([r['wall_s'] for r in samples[n]])['median']} s" for n in small)
        )
        for n in big:
            t = time.perf_counter()
            log(
                f"N = {n:,}: first repetition (up to {left():.0f} s), between {BRACKET} fans of {PAIR} before "
                f"and after"
            )
            samples[n].append(big_rep(n, max(left(), 10)))
            first = samples[n][-1]
            log(
                f"... {'finished' if first['finished'] else 'NOT finished'} in "
                f"{first.get('wall_s', first.get('elapsed_s'))} s"
            )
            more = Reps(args.big_reps - 1, None)
            if first["finished"]:
                # Keep time for the extra small repetitions: the big fan only gets what is left after them.
                small_cost = phase_s["small"] / max(args.min_reps, 1) * max(args.reps - args.min_reps, 0)
                more = Reps(args.big_reps - 1, max(0.0, left() - small_cost - 5))
                if left() - small_cost - 5 < first["wall_s"] * 1.1 + 2 * BRACKET * PAIR * 0.02:
                    more = Reps(0)
                for _ in more:
                    log(f"N = {n:,}: another repetition ({left():.0f} s left)")
                    samples[n].append(big_rep(n, max(left(), 10)))
            infos[str(n)] = {
                "planned": args.big_reps,
                "done": 1 + more.done,
                "budget_s": round(left(), 1),
                "cut_by_budget": 1 + more.done < args.big_reps,
            }
            phase_s[str(n)] = round(time.perf_counter() - t, 1)
            loads[str(n)] = round(os.getloadavg()[0], 2)
        t = time.perf_counter()
        one_small = phase_s["small"] / max(args.min_reps, 1)
        extra = Reps(args.reps - args.min_reps if left() > one_small * 1.2 else 0, max(0.0, left()))
        if args.reps > args.min_reps:
            log(f"extra repetitions of N <= {CHORD_N:,} within the budget ({left():.0f} s left)")
        for _ in extra:
            small_rep(small, samples, chords, max(left(), 30))
        done_small = args.min_reps + extra.done
        for n in [*small, "chord"]:
            infos[str(n)] = {
                "planned": args.reps,
                "done": done_small,
                "budget_s": round(args.budget, 1),
                "cut_by_budget": done_small < args.reps,
            }
        phase_s["extra"] = round(time.perf_counter() - t, 1)
        loads["extra"] = round(os.getloadavg()[0], 2)
        worker_rss = worker.rss()
    finally:
        worker.stop()
    time.sleep(1)  # the worker's database connections report their statistics as they close
    usage = index_usage(reads_before, index_reads(), executed["members"])
    truncate()

    fans = {str(n): fan_summary(n, samples[n], infos[str(n)]) for n in sizes}
    chord_wall = summary([c["wall_s"] for c in chords])
    chord_server = summary([c["finished_s"] for c in chords])
    chord = {
        "n": CHORD_N,
        "reps": infos["chord"],
        "wall_s": chord_wall,
        "finished_s": chord_server,
        "send_s": summary([c["send_s"] for c in chords]),
        "samples": chords,
        "per_task_ms": round(chord_wall["median"] / CHORD_N * 1000, 4),
    }
    goals: dict[str, Any] = {}
    if "100" in fans and str(BIG) in fans and "per_step_ms" in fans[str(BIG)]:
        paired = [r["paired_ratio"] for r in fans[str(BIG)]["samples"] if r.get("paired_ratio")]
        goals["per_step_10000_over_100"] = {
            "value": ratio(fans[str(BIG)]["per_step_ms"], fans["100"]["per_step_ms"]),
            "goal_max": 2.0,
            "paired": summary(paired, 2) if paired else None,
        }
    if str(CHORD_N) in fans:
        pairs = [
            f["wall_s"] / c["wall_s"] for f, c in zip(samples[CHORD_N], chords, strict=False) if f["finished"]
        ]
        goals["fan_1000_over_chord_1000"] = {
            "value": ratio(fans[str(CHORD_N)]["wall_s"]["median"], chord_wall["median"]),
            "goal_max": 1.0,
            "server_clock": ratio(fans[str(CHORD_N)]["finished_s"]["median"], chord_server["median"]),
            "paired": summary(pairs, 2),
        }
    data = {
        "meta": {
            "command": "bench/fans.py " + " ".join(sys.argv[1:]),
            "params": {
                "sizes": sizes,
                "reps": args.reps,
                "min_reps": args.min_reps,
                "big_reps": args.big_reps,
                "budget_s": args.budget,
                "chord_n": CHORD_N,
            },
            "database": DB,
            "broker": REDIS,
            "phase_seconds": phase_s,
            "phase_loadavg_1m": loads,
            **env.run_meta(source, loadavg_start, started, worker_rss),
        },
        "results": {"fans": fans, "chord": chord, "goals": goals, "checkpoint_index_reads": usage},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / "fans.json", args.out / "fans.md"
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    md_path.write_text(markdown(data))
    log(f"wrote {json_path} and {md_path} in {data['meta']['total_s']} s")
    if args.out.resolve() == env.RESULTS.resolve() and report.update_tables(
        "fans", tables_block(md_path.read_text())
    ):
        log(f"rewrote the fan tables in {report.TABLES}")
    print(md_path.read_text())
    return 0


# -- the report ---------------------------------------------------------------------------------


def tables_block(md: str) -> str:
    """docs/benchmarks.md's copy: the run's date line, then its goal and fan tables (sections 1-2)."""
    dated = md.split("\n")[2]
    tables = md.split("## Goals", 1)[1].split("\n## Where", 1)[0]
    return dated + "\n\n" + tables.replace("## Durable fan", "Durable fan").strip()


def _reps_text(info: dict[str, Any]) -> str:
    return f"{info['done']}" + (f" of {info['planned']} (time budget)" if info["cut_by_budget"] else "")


def _s(seconds: float) -> str:
    return _ms(seconds) if seconds < 1 else f"{seconds:.2f} s"


def markdown(data: dict[str, Any]) -> str:
    meta, res = data["meta"], data["results"]
    fans, chord, goals = res["fans"], res["chord"], res["goals"]
    lines = [
        "# durable fan benchmarks",
        "",
        report.machine_line(meta),
        "",
        report.sources_line(meta) + f"Command time: {meta['total_s']:.0f} s (`{meta['command'].strip()}`).",
        "",
        "Each figure is the median of its repetitions (every sample is in fans.json). The durable "
        "figure is the wall time from `durable.start()` to `durable.result()` returning (its own "
        "back-off poll, 5 ms growing to 50 ms); the chord's is from `apply_async()` until its "
        'callback\'s result row is SUCCESS, polled every 2 ms. "server clock" is the same start '
        "until the run's `finished_at` / the callback's `date_done` as the worker wrote them, "
        "which takes either side's waiting out.",
        "",
        "## Goals",
        "",
        "| Goal | measured | ratio | goal | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    g = goals.get("per_step_10000_over_100")
    if g:
        paired = (
            f" (each 10,000 against the fans of 100 run just before and after it: median {g['paired']['median']}x, "
            f"{g['paired']['min']}x – {g['paired']['max']}x)"
            if g.get("paired")
            else ""
        )
        lines.append(
            f"| Time per step, fan of 10,000 vs fan of 100 | {fans[str(BIG)]['per_step_ms']:.3f} ms vs "
            f"{fans['100']['per_step_ms']:.3f} ms | {g['value']}x{paired} | <= 2x "
            f"| {_verdict(g['value'], 2.0, True)} |"
        )
    elif str(BIG) in fans:
        lines.append(
            "| Time per step, fan of 10,000 vs fan of 100 | the fan of 10,000 did not finish in the "
            "time budget | n/a | <= 2x | **missed** |"
        )
    g = goals.get("fan_1000_over_chord_1000")
    if g:
        lines.append(
            f"| Durable fan of 1,000 vs Celery chord of 1,000 | {_s(fans['1000']['wall_s']['median'])} vs "
            f"{_s(chord['wall_s']['median'])} | {g['value']}x (server clock {g['server_clock']}x; "
            f"repetition by repetition: median {g['paired']['median']}x, {g['paired']['min']}x – "
            f"{g['paired']['max']}x) | <= 1x "
            f"| {_verdict(g['value'], 1.0, True)} |"
        )
    lines += [
        "",
        "## Durable fan: `ctx.map(bench.noop_step, range(N))`, returning the sum",
        "",
        "| N | start → result() | min – max | per step | steps/s | server clock | repetitions |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key, f in fans.items():
        if "wall_s" not in f:
            u = f["unfinished"][0]
            lines.append(
                f"| {int(key):,} | not finished after {_s(u['elapsed_s'])} "
                f"({u['rows']['completed']:,} of {u['rows']['members']:,} members done) | | | | | "
                f"{_reps_text(f['reps'])} |"
            )
            continue
        w = f["wall_s"]
        lines.append(
            f"| {int(key):,} | {_s(w['median'])} | {_s(w['min'])} – {_s(w['max'])} | "
            f"{f['per_step_ms']:.3f} ms | {f['steps_per_s']:,} | {_s(f['finished_s']['median'])} | "
            f"{_reps_text(f['reps'])} |"
        )
    c = chord
    lines += [
        "",
        f"Celery chord of {c['n']:,} no-op tasks with a sum callback, same worker and broker, result backend "
        f"django-db: {_s(c['wall_s']['median'])} (min {_s(c['wall_s']['min'])}, max {_s(c['wall_s']['max'])}; "
        f"{c['per_task_ms']:.3f} ms per task; server clock {_s(c['finished_s']['median'])}; of which "
        f"`apply_async()` itself {_s(c['send_s']['median'])}); {_reps_text(c['reps'])} repetitions.",
        "",
        "## Where a fan's time goes: its timeline (medians, seconds since `durable.start()`)",
        "",
        "Read back from the run's rows (the worker's clock is this machine's): the first turn claims "
        "the run · has recorded the N positions · the first member starts (after the bulk INSERT of N "
        "rows, the commit and the first message) · the `durable` queue is at its deepest, i.e. the first "
        'turn has sent all N messages, one by one after its commit (sampled every 5 ms; "-" when too '
        "short to see) · the last member's result is recorded · the run completed (fan-closed check, "
        "join turn) · `durable.result()` returned.",
        "",
        "| N | first turn | N recorded | first member starts | all N sent | last member done | run completed "
        "| result() returned |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, f in fans.items():
        p = f.get("timeline_median_s")
        if p:
            lines.append(
                f"| {int(key):,} | " + " | ".join("-" if p[k] is None else _s(p[k]) for k in TIMELINE) + " |"
            )
    usage = res.get("checkpoint_index_reads")
    if usage and usage["members"]:
        shown = ", ".join(
            f"`{name}` {u['entries_read_per_member']:,}"
            for name, u in usage["by_index"].items()
            if u["entries_read"]
        )
        lines += [
            "",
            "## Index entries read on durable_checkpoint",
            "",
            f"Over the whole command, {usage['entries_read_per_member']:,} index entries were read per fan "
            f"member executed ({usage['members']:,} members; by index: {shown}). A member's own statements "
            "need a handful; hundreds or thousands mean the planner scanned the fan's rows for each member "
            f"(autovacuum is {usage['autovacuum']} on this server, and the tables are emptied before each "
            "repetition, so the planner has no statistics).",
        ]
        big = fans.get(str(BIG), {}).get("samples", [])
        if big:
            lines += [
                "",
                f"Each fan of {BIG:,}, in order: "
                + "; ".join(
                    f"{_s(r.get('wall_s', r.get('elapsed_s', 0)))}, about {r.get('index_entries_read_per_member', 0):,} "
                    "entries read per member"
                    for r in big
                )
                + ".",
            ]
    worker = meta.get("worker_peak_rss")
    if worker:
        lines += [
            "",
            f"Worker peak RSS after the run: {worker['peak_total_mib']} MiB in all "
            f"(parent {worker['peak_parent_mib']} MiB, children {worker['peak_children_mib']} MiB).",
        ]
    lines += [
        "",
        "Packages: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v),
        "",
        f"Parameters: sizes {meta['params']['sizes']}, chord of {meta['params']['chord_n']:,}; "
        f"at least {meta['params']['min_reps']} and up to {meta['params']['reps']} repetitions for N <= 1,000 and "
        f"the chord, up to {meta['params']['big_reps']} for 10,000, as the budget of {meta['params']['budget_s']:.0f} s "
        f"allows. Database `{meta['database']}`, broker `{meta['broker']}`. Seconds per phase: {meta['phase_seconds']}; "
        f"1-minute load average as each ended: {meta['phase_loadavg_1m']}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
