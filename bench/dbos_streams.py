"""The DBOS Transact peer of ``bench/streams.py``, in its own process:
``python -m bench.dbos_streams N REPS``. A step writes N values with ``DBOS.write_stream``, the
workflow closes the stream, and this process reads it live with ``DBOS.read_stream`` from the
workflow's start. Prints one JSON object: the seconds from start to the last value read, per rep.
"""

from __future__ import annotations

import json
import sys
import time

from dbos import DBOS

from bench.env import DBOS_DB, PG

KEY = "values"

DBOS(
    config={"name": "durable-bench-streams", "system_database_url": f"{PG}/{DBOS_DB}", "log_level": "WARNING"}
)


@DBOS.step()
def produce(n: int) -> int:
    for i in range(n):
        DBOS.write_stream(KEY, i)
    return n


@DBOS.workflow()
def stream_flow(n: int) -> int:
    written = produce(n)
    DBOS.close_stream(KEY)
    return written


def once(n: int) -> float:
    t0 = time.perf_counter()
    handle = DBOS.start_workflow(stream_flow, n)
    got = list(DBOS.read_stream(handle.workflow_id, KEY))
    elapsed = time.perf_counter() - t0
    assert got == list(range(n)), got[:5]
    assert handle.get_result() == n
    return elapsed


def main() -> None:
    n, reps = (int(a) for a in sys.argv[1:3])
    DBOS.launch()
    once(n)  # warm-up
    print(json.dumps({"seconds": [once(n) for _ in range(reps)]}))
    DBOS.destroy()


if __name__ == "__main__":
    main()
