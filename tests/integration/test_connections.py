"""Durable's tasks never reuse a connection the database dropped, whatever Celery keeps.

Each task is traced as a worker's pool process runs it (Celery's tracer, not eager), with no
Django fix-up around it: what closes the connection here is durable's own hook.
"""

from __future__ import annotations

import uuid

import pytest
from celery import current_app, shared_task
from celery.app.trace import build_tracer
from django.db import connection

pytestmark = [pytest.mark.django_db(transaction=True)]


@shared_task(name="tests.lose_own_connection", ignore_result=True)
def lose_own_connection() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


def run_in_worker(name: str, **request: object) -> object:
    """Run task ``name`` as a worker does (prerun and postrun signals included); return its outcome."""
    task = current_app.tasks[name]
    return build_tracer(name, task, eager=False, propagate=False, app=current_app)(
        uuid.uuid4().hex, (), {}, request
    ).retval


def terminate_from_elsewhere() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = connection.get_new_connection(connection.get_connection_params())
    try:
        other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # returns once it is gone
    finally:
        other.close()


def test_a_durable_task_reconnects_when_the_database_dropped_the_connection_it_kept(postgres):
    terminate_from_elsewhere()  # as a PostgreSQL restart does to an idle worker's connection
    assert run_in_worker("durable.sweep_timers") == 0  # not an OperationalError


def test_a_kept_connection_is_pinged_at_a_task_start_only_when_the_database_may_have_dropped_it(
    postgres, monkeypatch
):
    assert connection.settings_dict["CONN_HEALTH_CHECKS"]
    pings = []
    usable = connection.is_usable
    monkeypatch.setattr(connection, "is_usable", lambda: pings.append(1) or usable())
    run_in_worker("durable.sweep_timers")  # opens the connection the next tasks keep
    pings.clear()
    kept = connection.connection
    assert run_in_worker("durable.sweep_timers") == 0
    assert (pings, connection.connection) == ([], kept)  # nothing to read on it: no round trip
    terminate_from_elsewhere()  # the server's goodbye now waits on the socket
    pings.clear()
    assert run_in_worker("durable.sweep_timers") == 0
    assert pings == [1] and connection.connection is not kept  # pinged, found dropped, replaced


def test_a_connection_error_inside_a_task_run_as_a_step_leaves_the_connection_closed(postgres):
    outcome = run_in_worker("tests.lose_own_connection", durable=["no-such-run", 0, 1])
    assert "terminating connection" in str(outcome)
    assert connection.connection is None  # so the process's next task opens a new one
