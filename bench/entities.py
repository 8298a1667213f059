"""The entity benchmark: ops/s of ``bench.counter`` ``add`` ops on one key and across 10 keys,
beside a plain ``SELECT ... FOR UPDATE`` + ``UPDATE`` loop on the same database in the same run.

    .venv-bench/bin/python bench/entities.py            # N = 2,000 ops, 3 repetitions, ~2 min

Durable: N ops sent by SENDERS threads with ``durable.signal_entity`` (each its own INSERT,
committed one by one, as views would; a key's ops committed while its prompt waits share that
prompt), applied by a real prefork worker (concurrency 2);
the time runs from the first send until every op is settled. The loop: N transactions of
``SELECT n ... FOR UPDATE`` then ``UPDATE``, one counter row per key, spread over as many
connections as the worker has processes. Writes bench/results/entities.json and entities.md,
and the ``bench:entities`` block of docs/benchmarks.md. Its services: PostgreSQL database ``durable_entities``
and Redis db 6 (``BENCH_ENTITIES_REDIS``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env, report  # noqa: E402
from bench.stats import ratio, summary, wait_until  # noqa: E402

DB = "durable_entities"
REDIS = os.environ.get("BENCH_ENTITIES_REDIS", "redis://127.0.0.1:6379/6")
SENDERS = 4
GOAL = 0.5  # durable's ops/s across keys, as a fraction of the loop's


def log(message: str) -> None:
    print(f"[entities {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def configure() -> None:
    env.DURABLE_DB = env.DBOS_DB = DB
    env.REDIS = REDIS
    env.ENV["DATABASE_URL"] = f"{env.PG}/{DB}"
    env.ENV["CELERY_BROKER_URL"] = REDIS


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("TRUNCATE durable_entity, durable_entityop, durable_entityprompt RESTART IDENTITY")


def backlog_once(n: int, keys: int) -> float:
    """Store ``n`` ops over ``keys`` keys with their prompts held back, then prompt each key once;
    return ops/s from the prompts until all are settled: what the applier alone sustains."""
    from django.db import transaction

    import durable
    from durable import dispatch
    from durable.models import EntityOp

    truncate()
    with dispatch.using(dispatch.Transport(send=lambda message: None)), transaction.atomic():
        for i in range(n):
            durable.signal_entity("bench.counter", f"k{i % keys}", "add", 1)
    began = time.perf_counter()
    for k in range(keys):
        dispatch.apply_entity("bench.counter", f"k{k}", "durable")
    wait_until(
        lambda: not EntityOp.objects.filter(status="pending").exists(),
        timeout=300,
        poll=0.005,
        what="every op applied",
    )
    return n / (time.perf_counter() - began)


def durable_once(n: int, keys: int) -> float:
    """Send ``n`` ops over ``keys`` keys from SENDERS threads; return ops/s until all are settled."""
    from django.db import connections
    from django.db.models import Sum

    import durable
    from durable.models import Entity

    truncate()

    def send(sender: int) -> None:
        try:
            for i in range(sender, n, SENDERS):
                durable.signal_entity("bench.counter", f"k{i % keys}", "add", 1)
        finally:
            connections.close_all()

    began = time.perf_counter()
    threads = [threading.Thread(target=send, args=(s,)) for s in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sent = time.perf_counter()
    wait_until(
        # Counted on the entities: settled ops beyond ENTITY_OPS_KEPT per key are pruned.
        lambda: Entity.objects.aggregate(applied=Sum("applied"))["applied"] == n,
        timeout=300,
        poll=0.005,
        what="every op applied",
    )
    elapsed = time.perf_counter() - began
    log(
        f"{n} ops over {keys} key(s): sent in {sent - began:.2f} s, all applied {elapsed:.2f} s after the first"
    )
    total = sum(durable.entity_state("bench.counter", f"k{k}")["n"] for k in range(keys))
    assert total == n, f"applied {total} of {n}"
    return n / elapsed


def loop_once(n: int, keys: int, connections_: int) -> float:
    """``n`` SELECT ... FOR UPDATE + UPDATE transactions over ``keys`` rows; return ops/s."""
    import psycopg

    url = f"{env.PG}/{DB}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_counter (key text PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("TRUNCATE bench_counter")
        for k in range(keys):
            conn.execute("INSERT INTO bench_counter VALUES (%s, 0)", (f"k{k}",))

    def work(worker: int) -> None:
        with psycopg.connect(url) as conn:
            for i in range(worker, n, connections_):
                key = f"k{i % keys}"
                with conn.transaction():
                    (value,) = conn.execute(
                        "SELECT n FROM bench_counter WHERE key = %s FOR UPDATE", (key,)
                    ).fetchone()
                    conn.execute("UPDATE bench_counter SET n = %s WHERE key = %s", (value + 1, key))

    began = time.perf_counter()
    threads = [threading.Thread(target=work, args=(w,)) for w in range(connections_)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return n / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--no-docs",
        "--no-readme",
        dest="no_docs",
        action="store_true",
        help="leave docs/benchmarks.md as it is",
    )
    args = parser.parse_args()
    started = time.monotonic()
    configure()
    env.setup()
    import bench.entity_workloads  # noqa: F401

    worker = env.Worker("entities")
    argv = worker.process.argv
    argv[argv.index("bench.workloads")] = "bench.workloads,bench.entity_workloads"
    worker.start()
    samples: dict[str, list[float]] = {
        f"{what}_{keys}": [] for what in ("durable", "backlog", "loop") for keys in (1, 10)
    }
    try:
        durable_once(200, 10)  # warm-up: connections, imports, the first plans
        for rep in range(args.reps):
            for keys in (1, 10):
                # Alternated, so a burst of other load on the machine weighs on both sides.
                samples[f"loop_{keys}"].append(loop_once(args.n, keys, worker.concurrency))
                samples[f"durable_{keys}"].append(durable_once(args.n, keys))
                samples[f"backlog_{keys}"].append(backlog_once(args.n, keys))
                log(
                    f"rep {rep + 1}, {keys} key(s): durable {samples[f'durable_{keys}'][-1]:.0f} ops/s, "
                    f"backlog {samples[f'backlog_{keys}'][-1]:.0f} ops/s, "
                    f"loop {samples[f'loop_{keys}'][-1]:.0f} ops/s"
                )
    finally:
        worker.stop()
    results = {name: summary(values, 1) for name, values in samples.items()}
    data = {
        "machine": env.machine(),
        "n": args.n,
        "reps": args.reps,
        "senders": SENDERS,
        "concurrency": worker.concurrency,
        "seconds": round(time.monotonic() - started, 1),
        "results": results,
    }
    md = markdown(data)
    out = env.RESULTS
    out.mkdir(parents=True, exist_ok=True)
    (out / "entities.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "entities.md").write_text(md)
    if not args.no_docs:
        report.update_tables("entities", md)
    print(md)
    return 0


def markdown(data: dict[str, Any]) -> str:
    r = data["results"]
    m = data["machine"]
    lines = [
        f"{m.get('date', '')} · {m.get('cpu', '?')}, {m.get('cores', '?')} cores · PostgreSQL "
        f"{m.get('postgresql', '?')} · Redis {m.get('redis', '?')} · {data['n']} `add` ops per repetition, "
        f"median of {data['reps']} · {data['seconds']} s",
        "",
        "| keys | durable, sent and applied | durable, applying a backlog | `SELECT … FOR UPDATE` + "
        "`UPDATE` loop | sent and applied / loop | backlog / loop |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for keys in (1, 10):
        d, b, loop = (r[f"{what}_{keys}"]["median"] for what in ("durable", "backlog", "loop"))
        lines.append(
            f"| {keys} | {d:.0f} ops/s | {b:.0f} ops/s | {loop:.0f} ops/s | {ratio(d, loop)} | {ratio(b, loop)} |"
        )
    share = ratio(r["durable_10"]["median"], r["loop_10"]["median"])
    verdict = "met" if share is not None and share >= GOAL else "**missed**"
    lines += [
        "",
        f"Goal: durable across 10 keys >= {GOAL:.0%} of the loop's ops/s, sent and applied: {verdict}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
