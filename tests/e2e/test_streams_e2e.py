"""Streams on a real worker, read live: a reader that starts before the run sees every value the
body writes, once and in order, although the worker is SIGKILLed mid-way (the turns replayed
after it write nothing twice); an async reader follows the same stream without blocking its
event loop; a step's writes come while it runs."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

import durable
from durable.models import Checkpoint
from durable.testing import wait_for
from tests.e2e.conftest import settings_fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s"}
durable_worker_options, short_lease = settings_fixtures(SETTINGS)
STEPS = 6


@durable.step(name="tests.e2e_streams.work")
def work(i: int) -> int:
    for n in range(3):
        durable.write_stream("tokens", f"{i}.{n}")
    time.sleep(0.4)  # long enough to be killed in
    return i * i


@durable.workflow(name="tests.e2e_streams.agent")
def agent(ctx, _):
    total = 0
    for i in range(STEPS):
        total += ctx.step(work, i)
        ctx.write_stream("progress", {"done": i + 1, "total": total})
    ctx.close_stream("progress")
    return total


def follow(run_id: str, key: str, into: list) -> threading.Thread:
    def read() -> None:
        try:
            into.extend(durable.read_stream(run_id, key, timeout=60))
        finally:
            connection.close()

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def test_a_live_reader_sees_every_value_of_the_body_once_in_order_through_a_worker_sigkill(durable_worker):
    durable_worker.start_beat()
    run = durable.start(agent)
    progress: list = []
    tokens: list = []
    readers = [follow(run.id, "progress", progress), follow(run.id, "tokens", tokens)]

    async def follow_async() -> list:
        try:
            return [value async for value in durable.aread_stream(run.id, "progress", timeout=60)]
        finally:
            await sync_to_async(lambda: connection.close())()  # the thread the reads ran in

    wait_for(
        lambda: Checkpoint.objects.filter(run_id=run.id, kind="stream").count() >= 2,
        timeout=30,
        what="the body to write twice",
    )
    durable_worker.kill()
    durable_worker.restart()
    awaited = asyncio.run(follow_async())  # started mid-way: it reads from the first value too
    for reader in readers:
        reader.join(90)
    assert durable.result(run.id, timeout=60) == sum(i * i for i in range(STEPS))
    expected = [{"done": i + 1, "total": sum(j * j for j in range(i + 1))} for i in range(STEPS)]
    assert progress == expected and awaited == expected
    # A step's writes come once per attempt: the one the kill cut wrote again when retried.
    firsts = [token for token in tokens if token.endswith(".0")]
    assert sorted(set(firsts)) == [f"{i}.0" for i in range(STEPS)]
    assert tokens[:3] == ["0.0", "0.1", "0.2"]
