"""``durable.debounce`` on a real worker and beat: a burst of concurrent calls starts one run,
with the last call's input, once the key stayed quiet for its period; the worker SIGKILLed while
that run's step runs, the calls made meanwhile gather into the next burst's one run, and after
the restart each burst's run ends once, with its last input."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection

import durable
from durable.models import Checkpoint, Run
from durable.testing import wait_for
from tests.e2e.conftest import settings_fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s"}
durable_worker_options, short_lease = settings_fixtures(SETTINGS)
PERIOD = timedelta(seconds=2)


@durable.step(name="tests.e2e_debounce.index")
def index(doc: int) -> int:
    time.sleep(1)  # long enough to be killed in
    return doc


@durable.workflow(name="tests.e2e_debounce.reindex")
def reindex(ctx, doc):
    return ctx.step(index, doc)


def call(n: int) -> str:
    try:
        return durable.debounce(reindex, n, key="doc-1", period=PERIOD).id
    finally:
        connection.close()


def test_bursts_start_one_run_each_with_their_last_input_through_a_worker_sigkill(durable_worker):
    durable_worker.start_beat()
    with ThreadPoolExecutor(4) as pool:
        ids = set(pool.map(call, range(8)))  # at once, racing for the key
    first = durable.debounce(reindex, 99, key="doc-1", period=PERIOD)
    quiet_from = durable.get_run(first.id).updated_at
    assert ids == {first.id}
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=first.id, started_at__isnull=False).exists(),
        timeout=30,
        what="the first burst's run to start its step",
    )
    started = Checkpoint.objects.get(run_id=first.id, seq=0).started_at
    # Not before the key was quiet for the period; within a timer pass of it (with slack).
    assert PERIOD <= started - quiet_from <= PERIOD + timedelta(seconds=5)
    durable_worker.kill()
    following = {durable.debounce(reindex, n, key="doc-1", period=PERIOD).id for n in (100, 101, 102)}
    assert len(following) == 1 and first.id not in following
    durable_worker.restart()
    assert durable.result(first.id, timeout=60) == 99
    assert durable.result(following.pop(), timeout=60) == 102
    assert Run.objects.filter(workflow="tests.e2e_debounce.reindex").count() == 2
