"""A broker flushed while step messages wait in it, with the product's default
STEP_REDISPATCH_AFTER (five minutes): every run must still complete within two
RECONCILE_INTERVALs of the flush, because the orphan sweep's probe overtakes the lost messages
and their attempts are sent again at once (see durable.engine.redispatch).

The worker imports this module (``--include``), so the workflow is registered on both sides.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db.models import Max
from django.utils import timezone

import durable
from durable.models import TERMINAL, Checkpoint, Run
from durable.testing import flush_broker, wait_for
from tests.e2e.conftest import settings_fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Only these differ from the defaults, here and (as DURABLE_<KEY>) in the worker and beat.
SETTINGS = {"LEASE": "3s", "RECONCILE_INTERVAL": "10s"}
RECONCILE = timedelta(seconds=10)
RUNS = 12


@durable.step
def part(n: int) -> int:
    time.sleep(0.3)
    return n * n


@durable.workflow(name="tests.broker_flush.fan")
def fan_flow(ctx, n):
    squares = ctx.map(part, [n, n + 1, n + 2])  # a fan: its members always cross the broker
    return ctx.step(part, sum(squares))


durable_worker_options, short_lease = settings_fixtures(SETTINGS)


def test_runs_whose_step_messages_were_flushed_complete_within_two_reconcile_intervals(
    postgres, redis_broker, durable_worker
):
    durable_worker.start_beat()
    ids = [durable.start(fan_flow, n).id for n in range(RUNS)]
    # Wait until the fans' messages queue up behind the two pool processes, then lose them all.
    wait_for(
        lambda: Checkpoint.objects.filter(run_id__in=ids, status="completed").count() >= 4,
        60,
        what="the first steps to complete",
    )
    flush_broker(durable_worker.queues)
    flushed = timezone.now()
    untaken = Checkpoint.objects.filter(
        run_id__in=ids, status="pending", started_at__isnull=True, enqueued_at__isnull=False
    ).count()
    wait_for(
        lambda: not Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists(),
        120,
        interval=0.5,
        what="every run to finish after the flush",
    )
    last = Run.objects.filter(id__in=ids).aggregate(last=Max("finished_at"))["last"]
    print(f"{untaken} untaken step messages flushed; all runs done {last - flushed} after the flush")
    assert untaken, "the flush found no step message waiting: the test proved nothing"
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {"completed"}
    assert last - flushed <= 2 * RECONCILE
    for n, run_id in enumerate(ids):
        assert durable.result(run_id) == (n * n + (n + 1) ** 2 + (n + 2) ** 2) ** 2
    assert Checkpoint.objects.filter(run_id__in=ids, redispatches__gt=0).exists()
