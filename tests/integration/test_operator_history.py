"""History an operator can trust: every failed attempt keeps its error and traceback, retry()
keeps the failure it retried, admin actions write Django history, idle sweeps stay quiet, and
retention asks ``run_evicting`` receivers before it deletes a tree."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from celery import shared_task
from django.contrib.admin.models import LogEntry
from django.test import Client, override_settings
from django.urls import reverse

import durable
from durable import Retry, clock, tasks
from durable.celery import QuietSweeps
from durable.engine import retention, sweeps
from durable.errors import MAX_TRACEBACK_CHARS
from durable.models import AttemptError, Checkpoint, Run
from durable.signals import run_evicting
from tests.transitions import forging

pytestmark = pytest.mark.django_db

FAILS = {"left": 0}


def _deep_failure(depth: int) -> None:
    if depth:
        _deep_failure(depth - 1)
    raise ValueError("the ledger is locked")


@durable.step(retry=Retry(max_attempts=3, initial="1s"))
def always_fails() -> None:
    _deep_failure(2)


@durable.step(local=True, retry=Retry(max_attempts=2, initial="1s"))
def local_fails() -> None:
    raise KeyError("no such account")


@durable.step(retry=Retry(max_attempts=1))
def fails_until_fixed() -> str:
    if FAILS["left"]:
        FAILS["left"] -= 1
        raise ConnectionError("payment provider is down")
    return "paid"


@durable.step(retry=Retry(max_attempts=1))
def huge_failure() -> None:
    raise RuntimeError("x" * (3 * MAX_TRACEBACK_CHARS))


@durable.workflow(name="tests.history_always_fails")
def always_fails_flow(ctx: durable.Context, _: Any) -> None:
    ctx.step(always_fails)


@durable.workflow(name="tests.history_local_fails")
def local_fails_flow(ctx: durable.Context, _: Any) -> None:
    ctx.step(local_fails)


@durable.workflow(name="tests.history_fixed")
def fixed_flow(ctx: durable.Context, _: Any) -> str:
    return ctx.step(fails_until_fixed)


@durable.workflow(name="tests.history_huge")
def huge_flow(ctx: durable.Context, _: Any) -> None:
    ctx.step(huge_failure)


def _run_through_backoffs(durable_env: Any) -> None:
    for _ in range(5):
        durable_env.run_until_idle()
        durable_env.advance_time("2s")


def test_every_failed_attempt_of_a_dispatched_step_keeps_its_error_and_traceback(durable_env: Any) -> None:
    run = durable.start(always_fails_flow)
    _run_through_backoffs(durable_env)

    assert durable.get_run(run.id).status == "failed"
    history = list(AttemptError.objects.filter(run_id=run.id).order_by("id"))
    assert [(e.seq, e.attempt) for e in history] == [(0, 1), (0, 2), (0, 3)]
    for failure in history:
        assert failure.error["type"] == "ValueError"
        assert failure.error["message"] == "the ledger is locked"
        assert "traceback" not in failure.error
        assert "in _deep_failure" in failure.traceback
        assert failure.traceback.rstrip().endswith("ValueError: the ledger is locked")
    # The position and the run keep the error's usual shape: no traceback inside it.
    assert "traceback" not in Checkpoint.objects.get(run_id=run.id, seq=0).error


def test_a_step_run_inside_the_turn_keeps_its_traceback_too(durable_env: Any) -> None:
    run = durable.start(local_fails_flow)
    _run_through_backoffs(durable_env)

    history = list(AttemptError.objects.filter(run_id=run.id).order_by("id"))
    assert [e.attempt for e in history] == [1, 2]
    assert all("KeyError: 'no such account'" in e.traceback for e in history)
    assert "in local_fails" in history[0].traceback


def test_a_traceback_is_kept_to_its_bounded_tail(durable_env: Any) -> None:
    run = durable.start(huge_flow)
    durable_env.run_until_idle()

    (failure,) = AttemptError.objects.filter(run_id=run.id)
    assert len(failure.traceback) <= MAX_TRACEBACK_CHARS + 4
    assert failure.traceback.startswith("...\n")
    assert failure.traceback.rstrip().endswith("x" * 100)


def test_retry_keeps_the_failure_it_retried(durable_env: Any) -> None:
    FAILS["left"] = 1
    run = durable.start(fixed_flow)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "failed"

    durable.retry(run.id)
    durable_env.run_until_idle()

    assert durable.result(run.id) == "paid"
    (kept,) = AttemptError.objects.filter(run_id=run.id)
    assert (kept.seq, kept.name, kept.attempt) == (0, fails_until_fixed.name, 1)
    assert kept.error["message"] == "payment provider is down"
    assert "ConnectionError" in kept.traceback


def test_the_run_page_shows_failed_attempts_with_their_traceback(
    admin_client: Client, durable_env: Any
) -> None:
    FAILS["left"] = 1
    run = durable.start(fixed_flow)
    durable_env.run_until_idle()

    html = admin_client.get(reverse("admin:durable_run_change", args=[run.id])).content.decode()

    assert "failed attempts" in html.lower()
    assert "payment provider is down" in html
    assert "Traceback (most recent call last)" in html


def test_admin_actions_write_django_history(admin_client: Client, durable_env: Any) -> None:
    FAILS["left"] = 1
    run = durable.start(fixed_flow)
    durable_env.run_until_idle()

    admin_client.post(
        reverse("admin:durable_run_changelist"), {"action": "retry_runs", "_selected_action": [run.id]}
    )

    (entry,) = LogEntry.objects.filter(object_id=run.id)
    assert entry.get_change_message() == "Retried in the admin"
    assert entry.user.username == "admin"
    assert entry.content_type.model_class() is Run


# -- quiet sweeps ---------------------------------------------------------------------------


def test_a_sweep_that_did_nothing_logs_at_debug_and_one_that_did_at_info(
    durable_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="durable")
    sweeps.run_noted("durable.sweep_timers")
    idle = [r for r in caplog.records if "durable.sweep_timers" in r.getMessage()]
    assert [r.levelno for r in idle] == [logging.DEBUG]

    caplog.clear()
    run = durable.start(always_fails_flow)
    with forging():
        Run.objects.filter(id=run.id).update(status="suspended", wake_at=clock.now() - timedelta(seconds=1))
    durable_env.drop()
    sweeps.run_noted("durable.sweep_timers")
    busy = [r for r in caplog.records if "durable.sweep_timers" in r.getMessage()]
    assert [r.levelno for r in busy] == [logging.INFO]


def _celery_record(name: str, msg: str, args: Any, data: dict[str, Any] | None = None) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, None)
    if data is not None:
        record.data = data
    return record


@pytest.mark.parametrize(
    ("record", "quiet"),
    [
        (_celery_record("celery.beat", "Sending due task %s (%s)", ("durable.sweep_timers", "x")), True),
        (_celery_record("celery.beat", "Sending due task %s (%s)", ("nightly", "shop.report")), False),
        (_celery_record("celery.worker.strategy", "received", (), {"name": "durable.sweep_orphans"}), True),
        (
            _celery_record(
                "celery.app.trace", "ok", (), {"name": "durable.sweep_timers", "return_value": "0"}
            ),
            True,
        ),
        (
            _celery_record(
                "celery.app.trace", "ok", (), {"name": "durable.sweep_timers", "return_value": "3"}
            ),
            False,
        ),
        (
            _celery_record("celery.app.trace", "ok", (), {"name": "durable.advance", "return_value": "0"}),
            False,
        ),
    ],
)
def test_celery_lines_about_idle_sweeps_are_demoted_to_debug(record: logging.LogRecord, quiet: bool) -> None:
    logging.getLogger(record.name).setLevel(logging.INFO)
    kept = QuietSweeps().filter(record)
    assert kept is not quiet
    assert (record.levelno == logging.DEBUG) is quiet


# -- retention's archival hook --------------------------------------------------------------


def _finished_tree(run_id: str) -> None:
    now = clock.now()
    old = now - timedelta(days=40)
    fields = dict(workflow="tests.kept", version="1", queue="durable", status="completed")
    Run.objects.create(id=run_id, created_at=old, updated_at=old, finished_at=old, **fields)
    Run.objects.create(
        id=f"{run_id}-child", parent_id=run_id, created_at=old, updated_at=old, finished_at=old, **fields
    )


def _sweep() -> int:
    with override_settings(DURABLE={"RETENTION": [{"max_age": "30d"}]}):
        return retention.sweep_retention()


def test_run_evicting_receivers_see_each_tree_before_it_is_deleted(durable_env: Any) -> None:
    _finished_tree("archived")
    seen = []

    def archive(sender: Any, run: Run, run_ids: list[str], **_: Any) -> None:
        # Called before the delete: the whole tree is still there to archive.
        seen.append((run.id, run_ids, Run.objects.filter(id__in=run_ids).count()))

    run_evicting.connect(archive)
    try:
        assert _sweep() == 2
    finally:
        run_evicting.disconnect(archive)
    assert seen == [("archived", ["archived", "archived-child"], 2)]
    assert not Run.objects.exists()


def test_a_raising_run_evicting_receiver_keeps_the_tree_and_is_logged(
    durable_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _finished_tree("kept")
    _finished_tree("gone")

    def archive(sender: Any, run: Run, **_: Any) -> None:
        if run.id == "kept":
            raise OSError("the archive bucket is full")

    run_evicting.connect(archive)
    try:
        deleted = _sweep()
    finally:
        run_evicting.disconnect(archive)

    assert deleted == 2
    assert sorted(Run.objects.values_list("id", flat=True)) == ["kept", "kept-child"]
    assert any(
        r.levelno == logging.ERROR and "kept" in r.getMessage() and "bucket is full" in r.getMessage()
        for r in caplog.records
    )


# -- a Celery task used as a step -------------------------------------------------------------


@shared_task(name="tests.history_legacy_boom")
def legacy_boom() -> None:
    raise ValueError("the legacy task failed")


@durable.workflow(name="tests.history_legacy")
def legacy_flow(ctx: durable.Context, _: Any) -> None:
    ctx.step(legacy_boom)


def test_a_celery_task_step_that_fails_keeps_the_traceback_its_errback_got(durable_env: Any) -> None:
    run = durable.start(legacy_flow)
    durable_env.run_next()  # the first turn sends the task
    durable_env.drop()
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    trace = (
        'Traceback (most recent call last):\n  File "legacy.py", line 3\nValueError: the legacy task failed\n'
    )

    # What Celery calls as the task's link_error on the worker where it failed for good.
    tasks.step_failed.run(
        None, ValueError("the legacy task failed"), trace, run_id=run.id, seq=0, attempt=1, token=row.token
    )

    (failure,) = AttemptError.objects.filter(run_id=run.id)
    assert failure.traceback == trace
    assert failure.error["message"] == "the legacy task failed"
    assert "traceback" not in Checkpoint.objects.get(run_id=run.id, seq=0).error


def test_a_receiver_whose_query_failed_keeps_its_tree_and_the_others_still_go(
    durable_env: Any, postgres: None
) -> None:
    from django.db import connection

    _finished_tree("kept")
    _finished_tree("gone")

    def archive(sender: Any, run: Run, **_: Any) -> None:
        if run.id == "kept":
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_archive_table")  # aborts a PostgreSQL transaction

    run_evicting.connect(archive)
    try:
        deleted = _sweep()
    finally:
        run_evicting.disconnect(archive)

    assert deleted == 2
    assert sorted(Run.objects.values_list("id", flat=True)) == ["kept", "kept-child"]
