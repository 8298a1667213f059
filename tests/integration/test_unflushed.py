"""A turn's claim and a worker's take commit without waiting for PostgreSQL's WAL flush: they
take a lease or a hold, which a crash may forget (judged then as never taken). The setting
holds for that statement's transaction alone, and never inside a caller's transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from durable import clock
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db(transaction=True)

SETTING = "set_config('synchronous_commit', 'off', true)"


@pytest.fixture
def postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")


def _run(run_id: str) -> Run:
    now = clock.now()
    return Run.objects.create(
        id=run_id,
        workflow="tests.unflushed",
        version="1",
        status="pending",
        queue="durable",
        created_at=now,
        updated_at=now,
    )


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def test_a_claim_does_not_wait_for_the_flush_and_leaves_the_session_as_it_was(postgresql):
    _run("r-claim")
    with CaptureQueriesContext(connection) as seen:
        claimed = Run.objects.claim("r-claim", "w/1", clock.now(), timedelta(seconds=30))
    assert claimed is not None and claimed.locked_by.startswith("w/1")
    assert SETTING in seen.captured_queries[0]["sql"]
    assert _synchronous_commit() == "on"


def test_a_take_does_not_wait_for_the_flush_unless_inside_a_transaction(postgresql):
    _run("r-take")
    now = clock.now()
    Checkpoint.objects.create(
        run_id="r-take",
        seq=0,
        kind="step",
        name="s",
        status="pending",
        attempt=1,
        enqueued_at=now,
        token="t",
        queue="durable",
    )
    until = now + timedelta(seconds=30)
    with CaptureQueriesContext(connection) as seen:
        taken = Checkpoint.objects.take("r-take", 0, 1, "t", "holder", now, until)
    assert taken is not None and SETTING in seen.captured_queries[0]["sql"]
    assert _synchronous_commit() == "on"
    Checkpoint.objects.filter(run_id="r-take").update(started_at=None, attempt=2)
    with transaction.atomic(), CaptureQueriesContext(connection) as seen:
        assert Checkpoint.objects.take("r-take", 0, 2, "t", "holder", now, until) is not None
        assert _synchronous_commit() == "on"
    assert not any(SETTING in q["sql"] for q in seen.captured_queries)
