"""What the async-steps benchmark runs, importable by the workers
(``--include bench.workloads,bench.async_workloads``): one step that waits a second on I/O,
as a durable ``async def`` step and as a plain Celery task for the gevent pool."""

from __future__ import annotations

import asyncio
import os
import time

import redis
from celery import shared_task

import durable

WAIT = 1.0
#: The Redis key the Celery twin counts its ends in (the bench reads it, no result backend).
DONE_KEY = "bench:async:gevent_done"


@durable.step(name="bench.async_wait")
async def async_wait(i: int) -> int:
    """An ``asyncio.sleep`` standing for a one-second network call."""
    await asyncio.sleep(WAIT)
    return i


@durable.workflow(name="bench.async_one")
def async_one(ctx: durable.Context, i: int) -> int:
    return ctx.step(async_wait, i)


_counter: redis.Redis | None = None


@shared_task(name="bench.gevent_wait", ignore_result=True)
def gevent_wait(i: int) -> int:
    """The same wait as a plain task: ``time.sleep`` is gevent's under the gevent pool."""
    global _counter
    time.sleep(WAIT)
    if _counter is None:
        # Greenlets wait for one of a few connections, rather than open one each.
        pool = redis.BlockingConnectionPool.from_url(
            os.environ["CELERY_BROKER_URL"], max_connections=20, timeout=60
        )
        _counter = redis.Redis(connection_pool=pool)
    _counter.incr(DONE_KEY)
    return i
