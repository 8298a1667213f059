"""``durable.result()`` is woken by PostgreSQL's notice of the run's end, sent by the transaction
that ends it; when a notice is lost, or the listener's connection is, the caller still gets the
result by polling."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

import durable
from durable import conf, dispatch, results, waiting
from durable.engine import turn
from durable.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@durable.step(local=True)
def add_one(value):
    return value + 1


@durable.workflow(name="tests.notices_quick")
def quick(ctx, value):
    return ctx.step(add_one, value)


@pytest.fixture
def quiet():
    """Runs started here send nothing: the test runs their turns itself, when it chooses."""
    with dispatch.using(dispatch.Transport(send=lambda message: None)) as transport:
        yield transport


def _later(seconds, action):
    def run():
        try:
            time.sleep(seconds)
            action()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _timed_result(run_id):
    t0 = time.monotonic()
    value = durable.result(run_id, timeout=20)
    return value, time.monotonic() - t0


def test_result_wakes_on_the_notice_the_ending_transaction_sends(postgres, quiet, monkeypatch):
    # Polls 30 s apart: only the notice can wake the caller in time.
    monkeypatch.setattr(results, "NOTIFIED_POLL", 30.0)
    run = durable.start(quick, 41)
    ender = _later(0.5, lambda: turn.advance(run.id))
    value, waited = _timed_result(run.id)
    ender.join()
    assert value == 42
    assert 0.4 < waited < 3


@pytest.fixture
def no_notices():
    """Runs end without their notice, as if it were lost."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE durable_run DISABLE TRIGGER durable_run_ended")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE durable_run ENABLE TRIGGER durable_run_ended")


def test_a_lost_notice_costs_one_poll_not_the_result(postgres, quiet, no_notices, monkeypatch):
    monkeypatch.setattr(results, "NOTIFIED_POLL", 0.5)
    run = durable.start(quick, 1)
    ender = _later(0.3, lambda: turn.advance(run.id))
    value, waited = _timed_result(run.id)
    ender.join()
    assert value == 2
    assert waited < 3


def test_the_transaction_that_ends_a_run_sends_its_notice(postgres, quiet):
    run = durable.start(quick, 1)
    with connection.cursor() as cursor:
        cursor.execute("LISTEN durable_run_ended")
    try:
        turn.advance(run.id)
        notices = list(connection.connection.notifies(timeout=2, stop_after=1))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("UNLISTEN durable_run_ended")
    assert [(n.channel, n.payload) for n in notices] == [("durable_run_ended", run.id)]


def test_callers_poll_while_the_listener_reconnects(postgres, quiet, monkeypatch):
    monkeypatch.setattr(results, "NOTIFIED_POLL", 30.0)
    run = durable.start(quick, 1)

    def cut_then_end():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
            )
        time.sleep(0.3)
        turn.advance(run.id)

    ender = _later(0.5, cut_then_end)
    value, waited = _timed_result(run.id)
    ender.join()
    assert value == 2
    assert waited < 5


def test_a_continued_run_hands_its_caller_over_to_its_successor(postgres, quiet, monkeypatch):
    monkeypatch.setattr(results, "NOTIFIED_POLL", 30.0)
    run = durable.start(chain, 0)

    def drive():
        successor = run.id
        while successor:
            turn.advance(successor)
            successor = Run.objects.filter(continued_from_id=successor).values_list("id", flat=True).first()
            time.sleep(0.2)

    ender = _later(0.3, drive)
    value, waited = _timed_result(run.id)
    ender.join()
    assert value == 2
    assert waited < 5


@durable.workflow(name="tests.notices_chain")
def chain(ctx, value):
    if value < 2:
        ctx.continue_as_new(value + 1)
    return value


def test_a_new_listener_hears_its_own_probe_before_callers_rely_on_it(postgres):
    waiting.stop_all()
    found = waiting.listener(conf.get().DATABASE, conf.get().LISTEN_DATABASE)
    assert found is not None and found.live and found.deaf_since is None


@pytest.fixture
def behind_a_pooler():
    """The suite reaches PostgreSQL through PgBouncer in transaction mode (DATABASE_URL), and
    directly through the alias ``listen`` (DATABASE_LISTEN_URL): CI's pgbouncer suite."""
    if "listen" not in settings.DATABASES:
        pytest.skip("needs DATABASE_URL through PgBouncer in transaction mode and DATABASE_LISTEN_URL")


def test_a_listener_behind_a_pooler_in_transaction_mode_stands_down_and_says_why(
    postgres, behind_a_pooler, caplog
):
    waiting.stop_all()
    with caplog.at_level(logging.WARNING, logger="durable.waiting"):
        assert waiting.listener("default") is None  # its LISTEN's session serves other clients
        assert waiting.listener("default") is None  # and it is not tried again at every wait
    assert caplog.text.count("did not reach the connection listening") == 1
    assert 'DURABLE["LISTEN_DATABASE"]' in caplog.text
    assert waiting.listener("default", "listen") is not None  # a direct connection hears


def test_behind_a_pooler_without_a_listen_database_callers_poll(
    postgres, behind_a_pooler, quiet, monkeypatch
):
    monkeypatch.setattr(results, "NOTIFIED_POLL", 30.0)  # were a deaf listener trusted, this would show
    waiting.stop_all()
    with override_settings(DURABLE={**settings.DURABLE, "LISTEN_DATABASE": None}):
        run = durable.start(quick, 6)
        ender = _later(0.5, lambda: turn.advance(run.id))
        value, waited = _timed_result(run.id)
        ender.join()
    assert value == 7
    assert waited < 3
