"""Scale: the hot paths on a database filled by SQL with a long history, against an empty one.

    .venv-bench/bin/python bench/scale.py            # fill once (kept), measure both, write results
    .venv-bench/bin/python bench/scale.py --refill   # fill again from scratch
    .venv-bench/bin/python bench/scale.py --empty-only   # the empty database alone, no fill
    .venv-bench/bin/python bench/scale.py --size 10x     # ten times the history, and a day's retention

The filled database (``durable_scale`` by default) holds 1,000,000 finished runs with ten
completed steps each, and 100,000 runs waiting on a timer a month away with three positions
each: about 10,300,000 checkpoints, written by ``generate_series`` (not through the API) and
kept between runs. Its run ids take the form ``durable.start()`` gives them (time-ordered: see
``durable/ids.py``); a database filled with ids of another form is filled again. The empty one
(``durable_scale_empty``) is migrated and emptied. Each is measured in a subprocess of its own,
one after the other, in the same run:

- ``start``: ``durable.start()`` of ``bench.local10``, its message published to Redis.
- ``turn``: ``durable.engine.turn.advance()`` of a started ``bench.local10`` (ten local steps).
- ``timers`` / ``orphans``: 10,000 due timers / expired leases inserted by SQL, then the sweep
  until every run was sent a turn, the messages really published to Redis (and counted there).
- ``retention``: 10,000 expired finished runs with ten checkpoints each, deleted by the sweep.
- ``backlog`` (filled database): 100,000 due timers drained, each time between two drains of
  10,000, and set against their mean.

With ``--size 10x`` the filled database (``durable_scale_10x``) holds ten times that (10,000,000
finished runs over the last ten days, 1,000,000 waiting, about 103,000,000 checkpoints, some 35
GiB), and its last round also measures a day's retention: the 1,000,000 runs of a day 40 days
ago, with ten checkpoints each, all expired, deleted by the retention sweep until none is left,
with the dead tuples that leaves (``pg_stat_user_tables``, summed over the partitions).

The history is partitioned by day (``durable/models/partitions.py``): before the fill, the days
it spans are made by the product's own ``ensure_days``, as the retention sweep would have made
them while that history was written.

Writes bench/results/scale.json and scale.md, and the ``bench:scale`` table of docs/benchmarks.md
(``scale-10x.*`` and ``bench:scale-10x`` with ``--size 10x``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/5")
#: The queue the swept runs belong to: their messages pile up there, counted, then purged.
QUEUE = "bench_scale"
SWEEP_ROWS = 10_000
#: The most days the filled history spans.
FILL_DAYS = 10
#: How many days ago the day whose retention is measured lies.
DAY_AGO = 40
#: Finished runs are kept 30 days; the filled ones finished within the last ten days, the ones the
#: retention measurements insert 40 and 60 days ago.
RETENTION = [{"statuses": ["completed", "failed"], "max_age": "30d"}]
GOALS = {"ratio": 1.5, "sweep_10k_s": 1.0, "backlog_ratio": 10.0, "day_s": 60}
#: The fills ``--size`` names: the filled database, its runs, and the day's retention measured.
SIZES = {
    "1x": {"db": "durable_scale", "runs": 1_000_000, "waiting": 100_000, "day": 0},
    "10x": {"db": "durable_scale_10x", "runs": 10_000_000, "waiting": 1_000_000, "day": 1_000_000},
}


# -- the fill (plain psycopg, no Django) ----------------------------------------------------------

RUN_COLUMNS = (
    "id, workflow, version, status, queue, input, output, namespace, tags, search_attributes, exposed, "
    "created_at, updated_at, started_at, finished_at, wake_at, recovery_attempts, wakes, admitted"
)
CHECKPOINT_COLUMNS = (
    "run_id, seq, kind, name, status, attempt, queue, input, output, started_at, finished_at, fail_fast, "
    "redispatches, task"
)


def _connect(db: str, autocommit: bool = True):
    import psycopg

    return psycopg.connect(f"{PG}/{db}", autocommit=autocommit)


def _ensure_db(name: str) -> None:
    with _connect("postgres") as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _run_id(at: str, salt: str) -> str:
    """SQL for the id ``durable.start()`` gives a run started at ``at`` (``durable/ids.py``: a
    version 7 UUID in hex, its random bits here drawn from ``salt``): the fill's rows lie in
    the table and its indexes as the product's own would."""
    ms = f"floor(extract(epoch FROM {at}) * 1000)"
    fraction = f"floor((extract(epoch FROM {at}) * 1000 - {ms}) * 4096)"
    return (
        f"lpad(to_hex({ms}::bigint), 12, '0') || '7' || lpad(to_hex({fraction}::int), 3, '0') "
        f"|| '8' || substr(md5({salt}), 1, 15)"
    )


#: What the fill's run ids look like; a database filled with other ids is filled again.
RUN_IDS = "uuid7, partitioned by day"


def filled(db: str) -> dict | None:
    """What an earlier fill recorded, if the database holds one."""
    with _connect(db) as conn:
        if not conn.execute("SELECT to_regclass('bench_scale_fill')").fetchone()[0]:
            return None
        row = conn.execute("SELECT info FROM bench_scale_fill").fetchone()
        return row[0] if row and row[0].get("run_ids") == RUN_IDS else None


def fill(db: str, runs: int, steps: int, waiting: int, chunk: int = 100_000) -> dict:
    """Write the history by SQL: indexes of the checkpoint table dropped during the load and
    built again after (as a restore would), the same definitions as the migrations'."""
    t0 = time.perf_counter()
    # Half a second apart, or closer so that the history spans ten days at most.
    spacing = min(0.5, FILL_DAYS * 86_400 / runs)
    today = datetime.now(UTC).date()
    _make_days(db, today - timedelta(days=int(runs * spacing / 86_400) + 1), today)
    with _connect(db) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("TRUNCATE durable_signal, durable_checkpoint, durable_run RESTART IDENTITY CASCADE")
        conn.execute("DROP TABLE IF EXISTS bench_scale_fill")
        saved = _drop_checkpoint_indexes(conn)
        # Times count from one instant: each statement is a transaction of its own, with a now()
        # of its own, and a run's id (made of its start) must be the same in its checkpoints'.
        started = conn.execute("SELECT now()").fetchone()[0].isoformat()
        finished_id = _run_id("t", "i::text")
        # Finished ``spacing`` apart, the last an hour before the fill.
        finished_at = (
            f"LATERAL (SELECT '{started}'::timestamptz - (({runs} - i) * interval '{spacing} s') "
            "- interval '1 h' AS t) at"
        )
        waiting_id = _run_id(f"('{started}'::timestamptz + i * interval '0.1 ms')", "'w' || i")
        try:
            for first in range(1, runs + 1, chunk):
                last = min(first + chunk - 1, runs)
                # Finished over the last days, 2% failed; ten completed steps each.
                conn.execute(
                    f"INSERT INTO durable_run ({RUN_COLUMNS}) SELECT {finished_id}, 'bench.filled', '1', "
                    "CASE WHEN i %% 50 = 0 THEN 'failed' ELSE 'completed' END, 'durable', "
                    "jsonb_build_object('order', i, 'items', jsonb_build_array('a', 'b')), "
                    "jsonb_build_object('total', i * 3), '', '[]', '{}', '{}', t, t, t, t + interval '2 s', "
                    "NULL, 0, 11, true FROM generate_series(%s::int, %s::int) i, " + finished_at,
                    (first, last),
                )
                conn.execute(
                    f"INSERT INTO durable_checkpoint ({CHECKPOINT_COLUMNS}) SELECT {finished_id}, s, 'step', "
                    "'bench.step', 'completed', 1, '', jsonb_build_object('args', jsonb_build_array(i, s)), "
                    "jsonb_build_object('value', i + s), t, t, false, 0, false FROM generate_series(%s::int, %s::int) i, "
                    f"generate_series(0, {steps - 1}) s, " + finished_at,
                    (first, last),
                )
                log(f"filled {last:,} of {runs:,} finished runs")
            # Waiting on a timer a month away: two steps done, the sleep pending.
            conn.execute(
                f"INSERT INTO durable_run ({RUN_COLUMNS}) SELECT {waiting_id}, 'bench.parked', '1', "
                "'suspended', 'durable', jsonb_build_object('order', i), NULL, '', '[]', '{}', '{}', now(), now(), "
                "now(), NULL, now() + interval '30 days' + i * interval '1 ms', 0, 3, true "
                "FROM generate_series(1, %s::int) i",
                (waiting,),
            )
            conn.execute(
                f"INSERT INTO durable_checkpoint ({CHECKPOINT_COLUMNS}, wake_at) SELECT {waiting_id}, s, "
                "CASE WHEN s < 2 THEN 'step' ELSE 'sleep' END, CASE WHEN s < 2 THEN 'bench.step' ELSE 'sleep' END, "
                "CASE WHEN s < 2 THEN 'completed' ELSE 'pending' END, 1, '', "
                "jsonb_build_object('args', jsonb_build_array(i, s)), CASE WHEN s < 2 THEN '{\"value\": 1}'::jsonb END, "
                "now(), CASE WHEN s < 2 THEN now() END, false, 0, false, CASE WHEN s = 2 THEN now() + interval '30 days' END "
                "FROM generate_series(1, %s::int) i, generate_series(0, 2) s",
                (waiting,),
            )
            log("filled the waiting runs; building the checkpoint indexes again")
        finally:
            # Also after a failed fill: the next run must not measure a table without its indexes.
            for statement in saved:
                conn.execute(statement)
        log("vacuum analyze")
        conn.execute("VACUUM ANALYZE durable_run")
        conn.execute("VACUUM ANALYZE durable_checkpoint")
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        checkpoints = conn.execute("SELECT count(*) FROM durable_checkpoint").fetchone()[0]
        info = {
            "finished_runs": runs,
            "run_ids": RUN_IDS,
            "waiting_runs": waiting,
            "checkpoints": checkpoints,
            "size_gib": round(size / 2**30, 2),
            "fill_s": round(time.perf_counter() - t0, 1),
            "filled_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        conn.execute("CREATE TABLE bench_scale_fill (info jsonb)")
        conn.execute("INSERT INTO bench_scale_fill VALUES (%s)", (json.dumps(info),))
    return info


def _drop_checkpoint_indexes(conn) -> list[str]:
    """Drop the checkpoint table's foreign key, unique constraint and secondary indexes; return
    the statements that create them again."""
    constraints = conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'durable_checkpoint'::regclass AND contype IN ('u', 'f')"
    ).fetchall()
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'durable_checkpoint' "
        "AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = 'durable_checkpoint'::regclass)"
    ).fetchall()
    for name, _ in constraints:
        conn.execute(f'ALTER TABLE durable_checkpoint DROP CONSTRAINT "{name}"')
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    return [
        *(
            f'ALTER TABLE durable_checkpoint ADD CONSTRAINT "{n}" {d}'
            for n, d in constraints
            if "UNIQUE" in d
        ),
        # A partitioned table's index reads "ON ONLY" the table: built so, it would cover no
        # partition (and stay invalid); built on the table, it is built on each partition.
        *(d.replace(" ON ONLY ", " ON ", 1) for _, d in indexes),
        *(
            f'ALTER TABLE durable_checkpoint ADD CONSTRAINT "{n}" {d}'
            for n, d in constraints
            if "UNIQUE" not in d
        ),
    ]


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the measurements (in a subprocess, Django pointed at one database) ----------------------------


def _django(db: str) -> None:
    import secrets

    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": os.environ.get("BENCH_SETTINGS", "project.settings"),
            "DATABASE_URL": f"{PG}/{db}",
            "CELERY_BROKER_URL": REDIS,
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(50),
            "DURABLE_LOG_LEVEL": "WARNING",
        }
    )
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from durable import conf

    call_command("migrate", verbosity=0)
    settings.DURABLE = {**getattr(settings, "DURABLE", {}), "RETENTION": RETENTION}
    conf.reset()
    import bench.workloads  # noqa: F401
    import project.celery  # noqa: F401 - the project's app sends durable's messages


def _redis():
    import redis

    return redis.Redis.from_url(REDIS)


def _sql(statement: str, params: tuple = ()) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _delete_runs(where: str, params: tuple) -> None:
    """Delete the runs ``where`` picks, with their rows (the database cascades nothing), and
    vacuum what that and the measurement left dead: autovacuum would in production, but may be
    off on a bench machine, and every repetition would otherwise pay for the ones before it."""
    for table in ("durable_checkpoint", "durable_signal"):
        _sql(f"DELETE FROM {table} WHERE run_id IN (SELECT id FROM durable_run WHERE {where})", params)
    _sql(f"DELETE FROM durable_run WHERE {where}", params)
    _sql("VACUUM durable_run, durable_checkpoint, durable_signal")


def _median_ms(samples: list[float]) -> dict:
    return {
        "median_ms": round(statistics.median(samples) * 1000, 3),
        "n": len(samples),
        "samples_s": [round(x, 6) for x in samples],
    }


def measure_start(n: int) -> dict:
    import durable

    ids, samples = [], []
    for _ in range(n + 10):
        t0 = time.perf_counter()
        ids.append(durable.start("bench.local10").id)
        samples.append(time.perf_counter() - t0)
    _delete_runs("id = ANY(%s)", (ids,))
    _redis().delete("durable")
    return _median_ms(samples[10:])


def measure_turn(n: int) -> dict:
    from dataclasses import replace

    import durable
    from durable import dispatch
    from durable.engine import turn

    ids, samples = [], []
    with dispatch.using(replace(dispatch.transport, send=lambda message: None)):
        for _ in range(n + 10):
            run_id = durable.start("bench.local10").id
            ids.append(run_id)
            t0 = time.perf_counter()
            outcome = turn.advance(run_id)
            samples.append(time.perf_counter() - t0)
            if outcome != "completed":
                raise RuntimeError(f"run {run_id} ended {outcome}")
    _delete_runs("id = ANY(%s)", (ids,))
    return _median_ms(samples[10:])


def _insert_swept(kind: str, count: int) -> None:
    """``count`` runs on QUEUE: due timers, expired leases, or finished long ago with ten steps."""
    fields = {
        "timers": "'suspended', NULL, NULL, now() - interval '5 min', NULL",
        "orphans": "'running', 'bench-dead-host:1/0', now() - interval '5 min', now() + interval '5 min', NULL",
        "retention": "'completed', NULL, NULL, NULL, now() - interval '60 days'",
    }[kind]
    _sql(
        "INSERT INTO durable_run (id, workflow, version, queue, namespace, tags, search_attributes, exposed, "
        "created_at, updated_at, started_at, recovery_attempts, wakes, admitted, "
        "status, locked_by, locked_until, wake_at, finished_at) "
        f"SELECT {_run_id('clock_timestamp()', 'random()::text')}, 'bench.parked', '1', '{QUEUE}', '', '[]', '{{}}', "
        f"'{{}}', now() - interval '61 days', now(), now() - interval '61 days', 0, 1, true, {fields} "
        "FROM generate_series(1, %s) i",
        (count,),
    )
    if kind == "retention":
        _sql(
            f"INSERT INTO durable_checkpoint ({CHECKPOINT_COLUMNS}) SELECT r.id, s, 'step', 'bench.step', "
            "'completed', 1, '', '{}', '{}', r.finished_at, r.finished_at, false, 0, false FROM durable_run r, "
            "generate_series(0, 9) s WHERE r.queue = %s AND r.status = 'completed'",
            (QUEUE,),
        )
    _sql("ANALYZE durable_run")
    # The rows just written go to disk now, not during the measurement: each figure is the
    # sweep's own work, not the flushing of a bulk insert the sweep never made.
    _sql("CHECKPOINT")


def _woken_in_redis(client) -> int:
    """How many run turns the messages waiting on QUEUE carry: one for a ``durable.advance``,
    one per run id for a ``durable.advance_batch``."""
    import base64

    woken = 0
    for raw in client.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        woken += len(args[0]) if message["headers"]["task"] == "durable.advance_batch" else 1
    return woken


def _drain(sweep, count: int) -> dict:
    found, passes, t0 = 0, 0, time.perf_counter()
    while found < count:
        found += sweep()
        passes += 1
        if passes > 1000:
            raise RuntimeError(f"{sweep.__name__} found {found} of {count}")
    return {"seconds": time.perf_counter() - t0, "passes": passes, "found": found}


def measure_sweep(kind: str, count: int, reps: int) -> dict:
    from durable.engine import retention, sweeps

    sweep = {
        "timers": sweeps.sweep_timers,
        "orphans": sweeps.sweep_orphans,
        "retention": retention.sweep_retention,
    }[kind]
    client, samples = _redis(), []
    for _ in range(reps):
        client.delete(QUEUE)
        _insert_swept(kind, count)
        sample = _drain(sweep, count)
        if kind != "retention":
            # Every wake really left: counted in Redis, then thrown away.
            sample["messages"] = client.llen(QUEUE)
            sample["published"] = _woken_in_redis(client)
            if sample["published"] < count:
                raise RuntimeError(f"{kind}: {sample['published']} of {count} wakes reached Redis")
        samples.append(sample)
        _delete_runs("queue = %s", (QUEUE,))
        client.delete(QUEUE)
    seconds = [s["seconds"] for s in samples]
    return {
        "count": count,
        "median_s": round(statistics.median(seconds), 3),
        "samples_s": [round(s, 3) for s in seconds],
        "passes": samples[0]["passes"],
        "published": samples[0].get("published"),
        "messages": samples[0].get("messages"),
    }


def _dead_tuples() -> dict:
    """Live and dead tuples of the history's tables, as PostgreSQL's statistics count them (this
    backend's own counts flushed first)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(1.5)  # the statistics are shared at most once a second
        # Each partition counts its own: summed under the table it is a partition of.
        cursor.execute(
            "SELECT coalesce(p.relname, s.relname) AS t, sum(s.n_live_tup), sum(s.n_dead_tup) "
            "FROM pg_stat_user_tables s LEFT JOIN pg_inherits i ON i.inhrelid = s.relid "
            "LEFT JOIN pg_class p ON p.oid = i.inhparent "
            "WHERE coalesce(p.relname, s.relname) IN ('durable_run', 'durable_checkpoint') GROUP BY 1 ORDER BY 1"
        )
        return {name: {"live": int(live), "dead": int(dead)} for name, live, dead in cursor.fetchall()}


def measure_day(count: int) -> dict:
    """A day's retention: the ``count`` runs of a day DAY_AGO days ago (started through the day,
    each finished a minute later, ten checkpoints each), expired, deleted by the retention sweep
    until none is left; the dead tuples that leaves for vacuum to chase."""
    from django.db import connection

    from durable.engine import retention
    from durable.models import partitions

    day = datetime.now(UTC).date() - timedelta(days=DAY_AGO)
    partitions.ensure_days(connection.alias, day, day)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC).isoformat()
    at = f"('{start}'::timestamptz + i * interval '{86_400 / count} s')"
    _sql(
        f"INSERT INTO durable_run ({RUN_COLUMNS}) SELECT {_run_id(at, 'i::text')}, 'bench.day', '1', 'completed', "
        f"'{QUEUE}', '{{}}', '{{}}', '', '[]', '{{}}', '{{}}', {at}, {at}, {at}, {at} + interval '1 min', NULL, 0, 11, "
        "true FROM generate_series(0, %s - 1) i",
        (count,),
    )
    _sql(
        f"INSERT INTO durable_checkpoint ({CHECKPOINT_COLUMNS}) SELECT r.id, s, 'step', 'bench.step', "
        "'completed', 1, '', '{}', '{}', r.started_at, r.finished_at, false, 0, false FROM durable_run r, "
        "generate_series(0, 9) s WHERE r.workflow = 'bench.day'"
    )
    _sql("VACUUM ANALYZE durable_run, durable_checkpoint")
    before = _dead_tuples()
    found, passes, t0 = 0, 0, time.perf_counter()
    while found < count:
        gone = retention.sweep_retention()
        found, passes = found + gone, passes + 1
        if not gone:
            raise RuntimeError(f"the retention sweep stopped at {found} of {count}")
    seconds = time.perf_counter() - t0
    after = _dead_tuples()
    _sql("VACUUM durable_run, durable_checkpoint")
    return {"count": count, "seconds": round(seconds, 1), "passes": passes, "before": before, "after": after}


def measure(db: str, params: dict) -> dict:
    _django(db)
    _delete_runs("queue = %s OR workflow = 'bench.local10'", (QUEUE,))
    out = {
        "start": measure_start(params["n"]),
        "turn": measure_turn(params["n"]),
    }
    for kind in ("timers", "orphans", "retention"):
        out[kind] = measure_sweep(kind, params["rows"], params["reps"])
    if params.get("backlog"):  # the last round of the filled database only
        out["backlog"] = measure_backlog(params["backlog"], params["rows"], params.get("backlog_reps", 1))
    if params.get("day"):  # the last round of the filled database only
        out["day"] = measure_day(params["day"])
    return out


def measure_backlog(count: int, beside: int, reps: int) -> dict:
    """The backlog drained ``reps`` times, each between two drains of ``beside`` timers: each
    backlog is set against the mean of its two neighbours, so a drift of the machine's speed
    between them (this machine's varies by half within minutes) does not pass for the sweep's."""
    small = [measure_sweep("timers", beside, 1)["median_s"]]
    large = []
    for _ in range(reps):
        large.append(measure_sweep("timers", count, 1))
        small.append(measure_sweep("timers", beside, 1)["median_s"])
    ratios = [one["median_s"] / ((small[i] + small[i + 1]) / 2) for i, one in enumerate(large)]
    return {
        **large[0],
        "median_s": round(statistics.median(one["median_s"] for one in large), 3),
        "samples_s": [one["median_s"] for one in large],
        "beside": {"count": beside, "samples_s": small, "median_s": round(statistics.median(small), 3)},
        "ratios": [round(r, 2) for r in ratios],
        "ratio": round(statistics.median(ratios), 2),
    }


def _pooled(measured: list[dict]) -> dict:
    """One database's rounds as one: each figure the median of all their samples."""
    out: dict = {}
    for key in ("start", "turn"):
        samples = [x for one in measured for x in one[key]["samples_s"]]
        out[key] = _median_ms(samples)
    for key in ("timers", "orphans", "retention"):
        seconds = [x for one in measured for x in one[key]["samples_s"]]
        out[key] = {
            **measured[-1][key],
            "median_s": round(statistics.median(seconds), 3),
            "samples_s": seconds,
        }
    backlog = [one["backlog"] for one in measured if "backlog" in one]
    if backlog:
        out["backlog"] = backlog[0]
    day = [one["day"] for one in measured if "day" in one]
    if day:
        out["day"] = day[0]
    out["rounds"] = len(measured)
    return out


# -- the report ----------------------------------------------------------------------------------


def rows(data: dict) -> list[dict]:
    empty, full = data["empty"], data["filled"]
    out = []
    for key, what in (("start", "`durable.start()`"), ("turn", "a turn of ten local steps")):
        e, f = empty[key]["median_ms"], full[key]["median_ms"]
        out.append({"what": what, "empty": f"{e:.2f} ms", "filled": f"{f:.2f} ms", "ratio": round(f / e, 2)})
    for key, what in (
        ("timers", "timer sweep, {:,} due timers, messages published"),
        ("orphans", "orphan sweep, {:,} expired leases, messages published"),
        ("retention", "retention sweep, {:,} expired runs with ten checkpoints each"),
    ):
        e, f = empty[key]["median_s"], full[key]["median_s"]
        out.append(
            {
                "what": what.format(empty[key]["count"]),
                "empty": f"{e:.3f} s",
                "filled": f"{f:.3f} s",
                "ratio": round(f / e, 2),
            }
        )
    if "day" in full:
        day = full["day"]
        dead = sum(day["after"][name]["dead"] - day["before"][name]["dead"] for name in day["after"])
        out.append(
            {
                "what": f"a day's retention (filled): {day['count']:,} expired runs with ten checkpoints each, "
                f"{day['passes']} sweeps; {dead:,} dead tuples it left",
                "empty": "",
                "filled": f"{day['seconds']:.1f} s",
                "ratio": f"goal <= {GOALS['day_s']} s, no dead tuples: "
                + ("met" if day["seconds"] <= GOALS["day_s"] and not dead else "**missed**"),
            }
        )
    if "backlog" in full:
        b, t = full["backlog"], full["backlog"]["beside"]
        out.append(
            {
                "what": f"timer backlog of {b['count']:,} drained (filled), against {t['count']:,} beside it",
                "empty": f"{t['median_s']:.3f} s",
                "filled": f"{b['median_s']:.3f} s",
                "ratio": b["ratio"],
            }
        )
    return out


def table(data: dict) -> list[str]:
    lines = ["| Path | empty database | filled database | ratio |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['what']} | {r['empty']} | {r['filled']} | {_ratio(r['ratio'])} |" for r in data["rows"]]
    return lines


def markdown(data: dict) -> str:
    fill = data["fill"]
    return "\n".join(
        [
            "# durable at scale: a long history against an empty database",
            "",
            data["meta"]["line"],
            "",
            f"Filled database: {fill['finished_runs']:,} finished runs, {fill['waiting_runs']:,} waiting runs, "
            f"{fill['checkpoints']:,} checkpoints, {fill['size_gib']} GiB, written by SQL in {fill['fill_s']:.0f} s "
            f"({fill['filled_at']}). Figures are medians over {_rounds(data['params']['rounds'])}, the two "
            f"databases alternating: start and turn {data['params']['n']} calls a round, sweeps "
            f"{data['params']['reps']} repetitions a round; every wake published to Redis and counted there."
            + (
                f" The backlog is drained {data['params']['backlog_reps']} times on the filled database, each "
                "time between two drains of the smaller count: its ratio is the median of each drain against "
                "the mean of its two neighbours."
                if "backlog" in data["filled"]
                else ""
            ),
            "",
            *table(data),
            "",
        ]
    )


def _ratio(ratio: float | str) -> str:
    return ratio if isinstance(ratio, str) else f"{ratio}x"


def _rounds(n: int) -> str:
    return "1 round" if n == 1 else f"{n} rounds"


def machine_line(total: float) -> str:
    import platform

    with _connect("postgres") as conn:
        pg = conn.execute("SHOW server_version").fetchone()[0].split()[0]
    return (
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {os.cpu_count()} cores · "
        f"Python {platform.python_version()} · PostgreSQL {pg} · {total:.0f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="1x",
        help="1x: 1,000,000 finished and 100,000 waiting runs (about 10 million checkpoints); 10x: ten "
        "times that, in a database of its own, and a day's retention (1,000,000 expired runs) measured",
    )
    parser.add_argument("--db", help="the filled database, kept between runs (default: by --size)")
    parser.add_argument("--empty-db", default="durable_scale_empty")
    parser.add_argument("--refill", action="store_true", help="fill the database again")
    parser.add_argument("--runs", type=int, help="finished runs of the fill (default: by --size)")
    parser.add_argument("--waiting", type=int, help="waiting runs of the fill (default: by --size)")
    parser.add_argument(
        "--day", type=int, help="expired runs of the day's retention (default: by --size; 0: skip)"
    )
    parser.add_argument("--n", type=int, default=200, help="start() and turn calls measured")
    parser.add_argument("--rows", type=int, default=SWEEP_ROWS, help="rows each sweep measurement handles")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each sweep measurement")
    parser.add_argument("--backlog", type=int, default=100_000, help="due timers of the backlog (0: skip)")
    parser.add_argument("--backlog-reps", type=int, default=3, help="repetitions of the backlog measurement")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating the two databases")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--empty-only",
        action="store_true",
        help="measure the empty database alone, backlog included (no fill; docs/benchmarks.md is left as is)",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--days", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.days:
        _django(args.days)
        from django.db import connection

        from durable.models import partitions

        first, last = (datetime.strptime(d, "%Y-%m-%d").date() for d in json.loads(args.params))
        partitions.ensure_days(connection.alias, first, last)
        return 0
    if args.measure:
        print(json.dumps(measure(args.measure, json.loads(args.params))))
        return 0
    size = SIZES[args.size]
    args.db = args.db or size["db"]
    args.runs = size["runs"] if args.runs is None else args.runs
    args.waiting = size["waiting"] if args.waiting is None else args.waiting
    args.day = size["day"] if args.day is None else args.day

    if args.empty_only:
        return empty_only(args)
    started = time.perf_counter()
    for db in (args.db, args.empty_db):
        _ensure_db(db)
        _migrate(db)
    info = None if args.refill else filled(args.db)
    if info is not None and (info["finished_runs"], info["waiting_runs"]) != (args.runs, args.waiting):
        info = None  # filled to another size
    if info is None:
        log(f"filling {args.db} ({args.runs:,} finished runs, {args.waiting:,} waiting)")
        info = fill(args.db, args.runs, 10, args.waiting)
        log(f"filled in {info['fill_s']} s: {info}")
    with _connect(args.empty_db) as conn:
        conn.execute("TRUNCATE durable_signal, durable_checkpoint, durable_run RESTART IDENTITY CASCADE")
    params = {"n": args.n, "rows": args.rows, "reps": args.reps, "backlog_reps": args.backlog_reps}
    data: dict = {"fill": info, "params": {**params, "backlog": args.backlog, "rounds": args.rounds}}
    # Rounds alternate the databases (empty, filled, filled, empty, ...) so that other load on
    # the machine falls on both alike; each figure is the median of every round's samples.
    order = [("empty", args.empty_db), ("filled", args.db)]
    rounds: dict[str, list[dict]] = {"empty": [], "filled": []}
    for i in range(args.rounds):
        for key, db in order if i % 2 == 0 else order[::-1]:
            last = i == args.rounds - 1 and key == "filled"
            log(f"round {i + 1} of {args.rounds}: measuring the {key} database {db}")
            extra = {"backlog": args.backlog, "day": args.day} if last else {}
            rounds[key].append(_measured(db, {**params, "backlog": 0, **extra}))
    for key, measured in rounds.items():
        data[key] = _pooled(measured)
    data["rows"] = rows(data)
    data["meta"] = {"line": machine_line(time.perf_counter() - started)}
    args.out.mkdir(parents=True, exist_ok=True)
    name = "scale" if args.size == "1x" else f"scale-{args.size}"
    (args.out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    text = markdown(data)
    (args.out / f"{name}.md").write_text(text)
    from bench import report

    block = "\n".join([data["meta"]["line"], "", *table(data)])
    if args.out.resolve() == (ROOT / "bench" / "results").resolve() and (
        report.update_tables("scale", block)
        if args.size == "1x"
        else report.update_tables("scale-10x", block)
    ):
        log(f"rewrote the {name} table in {report.TABLES}")
    print(text)
    return 0


def _measured(db: str, params: dict) -> dict:
    """One database measured in a subprocess of its own (a fresh Django pointed at it)."""
    out = subprocess.run(
        [sys.executable, __file__, "--measure", db, "--params", json.dumps(params)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def empty_only(args: argparse.Namespace) -> int:
    """The quick check: every path on the empty database, and the backlog drained there against
    its 10,000; writes scale-empty.json and prints the figures, docs/benchmarks.md untouched."""
    started = time.perf_counter()
    _ensure_db(args.empty_db)
    _migrate(args.empty_db)
    with _connect(args.empty_db) as conn:
        conn.execute("TRUNCATE durable_signal, durable_checkpoint, durable_run RESTART IDENTITY CASCADE")
    params = {
        "n": args.n,
        "rows": args.rows,
        "reps": args.reps,
        "backlog": args.backlog,
        "backlog_reps": args.backlog_reps,
    }
    log(f"measuring the empty database {args.empty_db}")
    data = _measured(args.empty_db, params)
    lines = ["| Path | empty database | wakes in Redis (messages) |", "| --- | --- | --- |"]
    lines += [
        f"| `durable.start()` | {data['start']['median_ms']:.2f} ms | |",
        f"| a turn of ten local steps | {data['turn']['median_ms']:.2f} ms | |",
    ]
    for key in ("timers", "orphans", "retention", "backlog"):
        if key in data:
            one = data[key]
            sent = f"{one['published']:,} ({one['messages']:,})" if one.get("published") else ""
            lines.append(
                f"| {key}, {one['count']:,} rows | {one['median_s']:.3f} s {one['samples_s']} | {sent} |"
            )
    if "backlog" in data:
        ratio = data["backlog"]["ratio"]
        lines.append(
            f"| backlog against the timers beside it | {ratio:.2f}x {data['backlog']['ratios']} "
            f"(goal <= {GOALS['backlog_ratio']:.0f}x) | |"
        )
    data["meta"] = {"line": machine_line(time.perf_counter() - started), "params": params}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale-empty.json").write_text(json.dumps(data, indent=2) + "\n")
    print("\n".join([data["meta"]["line"], "", *lines]))
    return 0


def _make_days(db: str, first, last) -> None:
    """The history's partitions of the days from ``first`` to ``last``, by the product's own
    function (in a subprocess with Django set up), as the retention sweep makes them."""
    days = json.dumps([first.isoformat(), last.isoformat()])
    subprocess.run([sys.executable, __file__, "--days", db, "--params", days], check=True, cwd=ROOT)


def _migrate(db: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        check=True,
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": f"{PG}/{db}", "CELERY_BROKER_URL": REDIS, "DJANGO_DEBUG": "1"},
    )


if __name__ == "__main__":
    sys.exit(main())
