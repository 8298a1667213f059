"""The DBOS Transact peer, in its own process: ``python -m bench.dbos_peer N REPS LATENCY_REPS BUDGET_S``.

The same workflow as ``bench.local10``: ten no-op steps, on the same PostgreSQL (database
``dbos_bench``). Prints one JSON object: sequential latencies and concurrent throughput samples.
"""

from __future__ import annotations

import json
import sys
import time

import psycopg
from dbos import DBOS

from bench.env import DBOS_DB, PG
from bench.stats import Reps

STEPS = 10

DBOS(config={"name": "durable-bench", "system_database_url": f"{PG}/{DBOS_DB}", "log_level": "WARNING"})


@DBOS.step()
def noop(i: int) -> int:
    return i


@DBOS.workflow()
def local10() -> int:
    total = 0
    for i in range(STEPS):
        total += noop(i)
    return total


def truncate() -> None:
    with psycopg.connect(f"{PG}/{DBOS_DB}", autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables "
                "WHERE schemaname = 'dbos' AND tablename IN ('workflow_status', 'operation_outputs')"
            )
        ]
        conn.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


def sequential(count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        assert local10() == sum(range(STEPS))
        out.append(time.perf_counter() - t0)
    return out


def started(n: int) -> float:
    """N workflows through DBOS's own ``DBOS.start_workflow`` (its executor), then every result."""
    t0 = time.perf_counter()
    handles = [DBOS.start_workflow(local10) for _ in range(n)]
    assert all(h.get_result() == sum(range(STEPS)) for h in handles)
    return time.perf_counter() - t0


def main() -> None:
    n, planned, latency_reps = (int(a) for a in sys.argv[1:4])
    budget = float(sys.argv[4]) or None
    DBOS.launch()
    truncate()
    sequential(5)  # warm-up
    truncate()
    result = {"sequential_s": sequential(latency_reps), "start_workflow_s": []}
    reps = Reps(planned, budget)
    for _ in reps:
        truncate()
        result["start_workflow_s"].append(started(n))
    result["reps"] = reps.info()
    DBOS.destroy()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
