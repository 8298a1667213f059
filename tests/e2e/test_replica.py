"""Callers' reads from a streaming replica (``DURABLE["READ_DATABASE"]``), on a primary and a
replica of the test's own: reads go to the replica while its replay keeps up, to the primary once
it lags past ``READ_DATABASE_MAX_LAG``, is paused too long, or is down; a run the replica does not
hold yet is read from the primary. A paused replay makes the replica's answers visibly stale,
which is how each test tells where a read went."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.urls import reverse

import durable
from durable import dispatch, reads
from durable.models import Run
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, databases=["default", "replica"])]

MAX_LAG = 3  # seconds
#: A lag the replica never reaches in a test: where its reads go depends on nothing but the test.
PATIENT = 600


@durable.workflow(name="tests.e2e_replica")
def idle(ctx, n):
    return n


@pytest.fixture
def reading_the_replica(replica, request) -> Iterator[None]:
    """The replica is read (past ``MAX_LAG``, or a test's ``max_lag`` mark); started runs send
    nothing (no worker here: rows are what is read)."""
    mark = request.node.get_closest_marker("max_lag")
    settings = {"READ_DATABASE": "replica", "READ_DATABASE_MAX_LAG": f"{mark.args[0] if mark else MAX_LAG}s"}
    with override_settings(DURABLE=settings), dispatch.using(dispatch.Transport(send=lambda message: None)):
        reads._lag.reading = None
        yield
    reads._lag.reading = None


def on_replica(run_id: str) -> Run | None:
    return Run.objects.using("replica").filter(id=run_id).first()


def replay(action: str) -> None:
    with connections["replica"].cursor() as cursor:
        cursor.execute(f"SELECT pg_wal_replay_{action}()")


def caught_up() -> bool:
    reads._lag.reading = None
    return reads.database() == "replica"


def test_reads_come_from_the_replica_while_it_keeps_up_and_from_the_primary_past_its_lag(
    reading_the_replica,
):
    run = durable.start(idle, 1)
    wait_for(lambda: on_replica(run.id) is not None, 30, what="the run to reach the replica")
    wait_for(caught_up, 30, what="the replica to count as caught up")
    replay("pause")
    try:
        durable.cancel(run.id, reason="on the primary only")
        reads._lag.reading = None
        assert durable.get_run(run.id).status == "pending"  # the replica's stale answer
        with pytest.raises(durable.WaitTimeout):
            durable.result(run.id, timeout=0.2)  # its polls read the replica too
        time.sleep(MAX_LAG + 1.5)  # its last replayed commit is now older than the allowed lag
        assert durable.get_run(run.id).status == "cancelled"
        with pytest.raises(durable.RunCancelled):
            durable.result(run.id, timeout=5)
    finally:
        replay("resume")
    wait_for(caught_up, 30, what="the replica to catch up again")
    assert durable.get_run(run.id).status == "cancelled"


@pytest.mark.max_lag(PATIENT)
def test_a_run_the_replica_does_not_hold_yet_is_read_from_the_primary(reading_the_replica):
    wait_for(caught_up, 30, what="the replica to count as caught up")
    replay("pause")
    try:
        run = durable.start(idle, 2)
        assert on_replica(run.id) is None
        assert reads.database() == "replica"
        assert durable.get_run(run.id).id == run.id
        durable.cancel(run.id)
        with pytest.raises(durable.RunCancelled):
            durable.result(run.id, timeout=5)
    finally:
        replay("resume")


@pytest.mark.max_lag(PATIENT)
def test_the_admin_list_and_the_cli_read_the_replica_and_a_run_page_the_primary(reading_the_replica, client):
    admin = get_user_model().objects.create_superuser("replica-admin", "a@example.com", "pw")
    wait_for(
        lambda: get_user_model().objects.using("replica").filter(pk=admin.pk).exists(), 30, what="the user"
    )
    wait_for(caught_up, 30, what="the replica to count as caught up")
    client.force_login(admin)
    replay("pause")
    try:
        run = durable.start(idle, 3)
        assert run.id not in client.get(reverse("admin:durable_run_changelist")).content.decode()
        page = client.get(reverse("admin:durable_run_change", args=[run.id]))
        assert page.status_code == 200 and run.id in page.content.decode()
        listed = StringIO()
        call_command("durable", "list", stdout=listed)
        assert run.id not in listed.getvalue()
    finally:
        replay("resume")
    wait_for(lambda: on_replica(run.id) is not None, 30, what="the run to reach the replica")
    wait_for(caught_up, 30, what="the replica to catch up again")
    assert run.id in client.get(reverse("admin:durable_run_changelist")).content.decode()


def test_a_replica_that_is_down_sends_reads_to_the_primary(reading_the_replica, replica, caplog):
    run = durable.start(idle, 4)
    replica.stop()
    reads._lag.reading = None
    with caplog.at_level(logging.WARNING, logger="durable.reads"):
        assert reads.database() == "default"
        assert durable.get_run(run.id).status == "pending"
    assert "did not answer" in caplog.text
