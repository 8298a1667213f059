"""A database restart costs a worker seconds: connections the restart broke are not reused.

The worker keeps its connections across tasks (the project sets ``CELERY_DB_REUSE_MAX``, as
README recommends). Every backend of the test database but the test's own is terminated, as a
PostgreSQL restart or failover would; the worker must run new work at once, by itself (no beat,
default lease and reconcile interval: no sweep repairs anything within the bound).
"""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings
from django.db import transaction

import durable
from durable.models import TERMINAL, Run
from durable.testing import cut_database_connections, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WARM_UP, AFTER_CUT = 4, 12
BOUND = 20  # seconds for every run started after the cut; they take well under one without it


@durable.step(timeout="10s")  # a timeout: dispatched as a run_step task, not run eagerly
def double(n: int) -> int:
    return n * 2


@durable.workflow(name="tests.e2e_database_restart")
def restart_flow(ctx, n):
    return ctx.step(double, n) + 1


def start(n: int) -> dict[str, int]:
    return {durable.start(restart_flow, i).id: i for i in range(n)}


def unfinished(ids: dict[str, int]) -> int:
    return Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).count()


def test_worker_that_reuses_connections_runs_new_work_at_once_after_the_database_cut_them(
    postgres, redis_broker, durable_worker
):
    assert settings.CELERY_DB_REUSE_MAX, "the case under test: Celery keeps connections across tasks"
    warm = start(WARM_UP)
    wait_for(
        lambda: not unfinished(warm), 60, what="the warm-up runs to finish"
    )  # a connection per pool process
    cut = cut_database_connections()
    assert cut, "no worker connection to cut"
    began = time.monotonic()
    ids = start(AFTER_CUT)
    try:
        wait_for(lambda: not unfinished(ids), BOUND, what=f"{AFTER_CUT} runs started after the cut to finish")
    finally:
        log = durable_worker.logs()
        print(
            f"\ndatabase cut ({cut} backends): {AFTER_CUT - unfinished(ids)} of {AFTER_CUT} new runs finished in "
            f"{time.monotonic() - began:.2f} s; worker log: {log.count('the connection is closed')} "
            f"'the connection is closed', {log.count('raised unexpected')} failed tasks"
        )
    ended = {run.id: (run.status, run.output) for run in Run.objects.filter(id__in=ids)}
    assert ended == {run_id: ("completed", 2 * n + 1) for run_id, n in ids.items()}
    assert "raised unexpected" not in log


def test_after_a_cut_this_process_goes_on_at_once_even_behind_a_pooler(postgres):
    """The cut returns once the backends it terminated have exited: behind PgBouncer a server
    connection still dying was otherwise handed to the next statement here, which failed with
    "terminating connection due to administrator command" and broke the test's connection (about
    one cut in forty, with other clients busy; in CI's PgBouncer suite). On a direct connection
    the old cut fails it too: its backends were still there when it returned."""
    from django.db import connections

    stop = threading.Event()

    def busy() -> None:  # another client of the database, as a worker is
        try:
            while not stop.is_set():
                try:
                    Run.objects.filter(id="none").exists()
                except Exception:  # noqa: BLE001 - cut: the next query reconnects
                    connections["default"].close()
                time.sleep(0.002)
        finally:
            connections.close_all()

    clients = [threading.Thread(target=busy) for _ in range(6)]
    for client in clients:
        client.start()
    try:
        for _ in range(120):
            # One transaction, so one backend of ours throughout (behind a pooler too): those the
            # cut terminated are gone when it returns, not only signalled.
            with transaction.atomic():
                before = _other_backends()
                cut_database_connections()
                assert not before & _other_backends(), "a terminated backend outlived the cut"
            for _ in range(3):
                Run.objects.filter(id="none").exists()  # raised here, now and then, before
            time.sleep(0.02)
    finally:
        stop.set()
        for client in clients:
            client.join()


def _other_backends() -> set[int]:
    """The pids of the test database's backends but the one this statement runs on."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else read once per transaction
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return {pid for (pid,) in cursor.fetchall()}
