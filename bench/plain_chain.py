"""The second anchor: a plain Celery app's chain of ten no-op tasks, with no Django at all.

The suite's first anchor is the same chain on the Django worker (django-celery-results' database
backend, Django's per-task connection handling); a user also asks how durable compares with Celery
as it runs without Django. This app has a Redis result backend on the broker's Redis server, and
the worker shape and delivery settings of the project's worker (prefork, concurrency 2, late acks,
prefetch 1, JSON), on a queue of its own: ``celery -A bench.plain_chain worker``, started here with
``DJANGO_SETTINGS_MODULE`` unset and Celery's Django fix-up off.

Waited for as the suite waits for durable's runs: one look every 2 ms at the last task's result
(one at a time, interleaved with durable's runs and the Django-worker chain in families 1 and
their broker twins, this worker idle beside theirs), a count every 20 ms (many at once, alone:
the last task of each chain counts itself in Redis, one ``INCR``).
"""

from __future__ import annotations

import contextlib
import os
import time

from celery import Celery, chain

BROKER = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/5")
QUEUE = "plain"
STEPS = 10
DONE_KEY = "bench:plain:done"
POLL = 0.002

# Not the current app: the bench process starts durable's runs through the project's.
app = Celery("plain", broker=BROKER, backend=BROKER, fixups=[], set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"visibility_timeout": 3600},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


# As the Django-worker chain's: intermediate links store no result (a chain needs none), the last
# stores its own, in Redis here.
@app.task(name="plain.noop", ignore_result=True)
def noop(i: int) -> int:
    return i


@app.task(name="plain.noop_last")
def noop_last(i: int) -> int:
    app.backend.client.incr(DONE_KEY)
    return i


def chain10():
    return chain(*[noop.si(i) for i in range(STEPS - 1)], noop_last.si(STEPS - 1))


class Worker:
    """``celery -A bench.plain_chain worker``, prefork, the suite's concurrency, no Django."""

    def __init__(self, concurrency: int) -> None:
        from bench import env
        from durable.processes import CeleryProcess

        self.concurrency = concurrency
        self.log_path = env.RESULTS / "worker-plain.log"
        self.log_path.write_text("")
        argv = env.worker_argv("bench.plain_chain", "plain", concurrency, QUEUE)
        environment = {**os.environ, **env.ENV, "BENCH_REDIS": BROKER}
        environment.pop("DJANGO_SETTINGS_MODULE", None)
        self.process = CeleryProcess(argv, environment, self.log_path, "")

    def start(self) -> Worker:
        import psutil

        with app.connection_for_write() as conn, contextlib.suppress(Exception):
            conn.default_channel.queue_purge(QUEUE)  # a queue not declared yet holds nothing
        self.process.start(wait=False)
        deadline = time.monotonic() + 90
        assert self.process.proc is not None
        while len(psutil.Process(self.process.proc.pid).children(recursive=True)) < self.concurrency:
            if not self.process.alive or time.monotonic() > deadline:
                raise RuntimeError(f"plain worker did not start:\n{self.process.log()[-3000:]}")
            time.sleep(0.1)
        chain10().apply_async().get(timeout=90, interval=0.05)
        return self

    def stop(self) -> None:
        self.process.stop()


def once() -> float:
    """One chain, start to its last result seen (a look every 2 ms)."""
    client = app.backend.client
    t0 = time.perf_counter()
    last = chain10().apply_async()
    key = app.backend.get_key_for_task(last.id)
    deadline = t0 + 120
    while client.get(key) is None:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"plain chain {last.id} did not finish")
        time.sleep(POLL)
    return time.perf_counter() - t0


def many(n: int) -> dict[str, float]:
    """``n`` chains sent back to back; seconds until all finished (a count every 20 ms)."""
    client = app.backend.client
    client.delete(DONE_KEY)
    t0 = time.perf_counter()
    for _ in range(n):
        chain10().apply_async()
    sent = time.perf_counter() - t0
    deadline = t0 + 1800
    while int(client.get(DONE_KEY) or 0) < n:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{n} plain chains did not finish")
        time.sleep(0.02)
    return {"total_s": time.perf_counter() - t0, "send_s": sent}


def at_once(n: int, planned: int, budget: float | None = None) -> dict:
    """``n`` chains at once, repeated; the worker started (``Worker``) and warm."""
    from bench.stats import Reps, summary

    reps = Reps(planned, budget)
    runs = [many(n) for _ in reps]
    return {
        "n": n,
        "chain_per_s": summary([n / r["total_s"] for r in runs], 1),
        "chain_send_s": summary([r["send_s"] for r in runs]),
        "reps": reps.info(),
    }
