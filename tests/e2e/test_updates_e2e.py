"""Updates that answer and queries, end to end: the caller and the workflow's turns run in
different processes (a real ``celery worker`` on the configured broker and database)."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint, Signal
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@durable.step
def weigh(parcel):
    return len(parcel) * 100


@durable.workflow(name="tests.e2e_updates_counter")
def counter(ctx, start):
    total = start
    ctx.expose("total", total)
    while True:
        update = ctx.wait_for_update("add")
        if update.payload is None:
            ctx.reply(update, "closed")
            return total
        total += ctx.step(weigh, update.payload)  # a dispatched step between wait and reply
        ctx.expose("total", total)
        ctx.reply(update, {"total": total})


@counter.validator("add")
def _a_parcel(payload):
    if payload is not None and not isinstance(payload, str):
        raise ValueError("a parcel is named by a string")


def test_update_with_wait_returns_the_reply_of_the_body_on_a_worker(durable_worker):
    run = durable.start(counter, 0)
    assert durable.update(run.id, "add", "box", wait="20s") == {"total": 300}
    assert durable.update(run.id, "add", "tube", wait="20s") == {"total": 700}
    with pytest.raises(durable.UpdateRejected):
        durable.update(run.id, "add", 5, wait="20s")
    assert durable.update(run.id, "add", None, wait="20s") == "closed"
    assert durable.result(run.id, timeout="20s") == 700
    assert Checkpoint.objects.filter(run_id=run.id, kind="reply").count() == 3


def test_query_reads_a_value_exposed_by_a_running_run(durable_worker):
    run = durable.start(counter, 40)
    assert durable.query(run.id, "total", timeout="20s") == 40
    durable.update(run.id, "add", "bag")
    wait_for(lambda: durable.query(run.id, "total") == 340, timeout=20, what="the exposed total")
    assert durable.get_run(run.id).status == "suspended"  # still running: waiting for the next update
    assert durable.query(run.id) == {"total": 340}


def test_an_update_sent_while_no_worker_runs_is_answered_once_one_does(durable_worker):
    run = durable.start(counter, 0)
    assert durable.query(run.id, "total", timeout="20s") == 0
    durable_worker.kill()
    with pytest.raises(durable.WaitTimeout, match="the run is suspended"):
        durable.update(run.id, "add", "crate", wait="1s", idempotency_key="crate-1")
    durable_worker.restart()
    # The caller retries with the same key: nothing new is sent, the first update's reply comes.
    assert durable.update(run.id, "add", "crate", wait="30s", idempotency_key="crate-1") == {"total": 500}
    assert Signal.objects.filter(run_id=run.id).count() == 1
