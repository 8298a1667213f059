"""RETENTION: the retention sweep deletes finished runs no policy keeps, whole trees only."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.signals import post_delete
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from durable import clock, conf
from durable.engine import retention
from durable.models import Checkpoint, Run, Signal
from tests.transitions import forging

pytestmark = pytest.mark.django_db


def _run(run_id, *, status="completed", age_days=0.0, workflow="tests.kept", parent=None):
    now = clock.now()
    finished = None if status in ("pending", "running", "suspended") else now - timedelta(days=age_days)
    run = Run.objects.create(
        id=run_id,
        workflow=workflow,
        version="1",
        queue="durable",
        status=status,
        parent_id=parent,
        created_at=now - timedelta(days=age_days),
        updated_at=now,
        finished_at=finished,
    )
    Checkpoint.objects.create(run=run, seq=0, kind="step", name="s", status="completed")
    Signal.objects.create(run=run, name="go", created_at=now)
    return run


def _ids():
    return sorted(Run.objects.values_list("id", flat=True))


def _sweep(*policies):
    with override_settings(DURABLE={"RETENTION": list(policies)}):
        return retention.sweep_retention()


def test_without_policies_nothing_is_deleted(durable_env):
    _run("old", age_days=400)
    assert retention.sweep_retention() == 0
    assert _ids() == ["old"]


def test_max_age_deletes_older_finished_runs_with_their_rows(durable_env):
    _run("old", age_days=40)
    _run("young", age_days=10)
    _run("waiting", status="suspended", age_days=90)
    assert _sweep({"max_age": "30d"}) == 1
    assert _ids() == ["waiting", "young"]
    assert not Checkpoint.objects.filter(run_id="old").exists()
    assert not Signal.objects.filter(run_id="old").exists()


def test_max_count_keeps_the_newest(durable_env):
    for i in range(5):
        _run(f"r{i}", age_days=i)  # r0 is the newest
    assert _sweep({"max_count": 2}) == 3
    assert _ids() == ["r0", "r1"]


def test_statuses_and_workflows_narrow_a_policy(durable_env):
    _run("done", age_days=5)
    _run("failed", status="failed", age_days=5)
    _run("other", age_days=5, workflow="tests.other")
    assert _sweep({"statuses": ["failed"], "max_age": "1d"}) == 1
    assert _ids() == ["done", "other"]
    assert _sweep({"workflows": ["tests.other"], "max_age": "1d"}) == 1
    assert _ids() == ["done"]


def test_a_tree_goes_whole_and_only_once_nothing_in_it_runs(durable_env):
    _run("root", age_days=10)
    _run("child", age_days=10, parent="root")
    _run("grandchild", status="suspended", parent="child")  # started with start_child, still going
    _run("busy", age_days=10)
    _run("busy-child", status="running", parent="busy")
    assert _sweep({"max_age": "1d"}) == 0
    assert _ids() == ["busy", "busy-child", "child", "grandchild", "root"]
    Run.objects.filter(id__in=["grandchild", "busy-child"]).update(
        status="completed", finished_at=clock.now()
    )
    # Children are never candidates themselves: they go with their root.
    assert _sweep({"max_age": "1d"}) == 5
    assert _ids() == []


def test_a_backlog_drains_in_batches(durable_env, monkeypatch):
    monkeypatch.setattr(retention, "BATCH", 3)
    for i in range(10):
        _run(f"r{i}", age_days=10 + i)
    assert _sweep({"max_age": "1d"}) == 10
    assert _ids() == []


def test_manage_py_durable_sweep_applies_retention(durable_env):
    _run("old", age_days=40)
    out = StringIO()
    with override_settings(DURABLE={"RETENTION": [{"max_age": "30d"}]}):
        call_command("durable", "sweep", stdout=out)
    assert out.getvalue().rstrip().endswith("deleted 1 finished run")
    assert _ids() == []


def test_the_retention_sweep_is_on_the_beat_schedule():
    from durable.celery import beat_schedule

    entry = beat_schedule()["durable.sweep_retention"]
    assert entry["task"] == "durable.sweep_retention" and entry["schedule"] == 60.0


def test_a_run_retried_while_the_sweep_looks_is_not_deleted(durable_env):
    _run("old", status="failed", age_days=40)
    candidates = retention.expired(conf.RetentionPolicy(max_age=timedelta(days=30)), clock.now(), 10)
    with forging():
        Run.objects.filter(id="old").update(status="pending", finished_at=None)  # retry() reopened it
    assert retention.delete_trees(candidates) == 0
    assert _ids() == ["old"]


def test_advance_time_applies_retention_as_beat_would(durable_env):
    _run("done", age_days=0)
    with override_settings(DURABLE={"RETENTION": [{"max_age": "7d"}]}):
        durable_env.advance_time("6d")
        assert _ids() == ["done"]
        durable_env.advance_time("2d")
    assert _ids() == []


def test_a_run_continued_as_new_outlives_the_run_it_continued(durable_env):
    _run("old", age_days=40)
    successor = _run("successor", status="suspended")
    Run.objects.filter(id="successor").update(continued_from_id="old")
    assert _sweep({"max_age": "30d"}) == 1
    successor.refresh_from_db()
    assert successor.continued_from_id is None
    assert _ids() == ["successor"]


@pytest.mark.django_db(transaction=True)
def test_a_tree_deleted_commits_whole(durable_env):
    _run("root", age_days=10)
    _run("child", age_days=10, parent="root")
    _run("grandchild", age_days=10, parent="child")
    _run("other", age_days=10)
    # Each pass commits its batches: the references between the runs are checked there.
    assert _sweep({"max_age": "1d"}) == 4
    assert _ids() == []
    assert not Checkpoint.objects.exists() and not Signal.objects.exists()


def test_a_receiver_of_django_s_delete_signals_hears_every_row_the_sweep_deletes(durable_env):
    heard: list[tuple[str, int]] = []

    def noted(sender, instance, **kwargs):
        heard.append((instance.run_id, instance.seq))

    _run("old", age_days=40)
    post_delete.connect(noted, sender=Checkpoint)
    try:
        assert _sweep({"max_age": "30d"}) == 1
    finally:
        post_delete.disconnect(noted, sender=Checkpoint)
    assert heard == [("old", 0)]


@pytest.mark.parametrize("runs", [3, 30])
def test_a_batch_is_deleted_in_statements_as_many_whatever_its_size_and_no_payload_is_read(
    durable_env, runs, monkeypatch
):
    monkeypatch.setattr(retention, "BATCH", runs)
    for i in range(runs):
        _run(f"r{i:02}", age_days=40)
    with CaptureQueriesContext(connection) as captured:
        assert _sweep({"max_age": "30d"}) == runs
    statements = [q["sql"] for q in captured.captured_queries]
    # Nothing is offloaded: the doomed rows' payloads are never read to look for references.
    assert not [sql for sql in statements if '"input"' in sql or '"output"' in sql]
    writes = [
        sql
        for sql in statements
        if sql.startswith(("DELETE", "UPDATE"))
        and "durable_event" not in sql
        and "durable_presence" not in sql
    ]
    # One statement per table a run's rows live in, and one setting null the references of the
    # runs that continued them, for the whole batch, whatever its size.
    assert len(writes) == 8
    assert len([sql for sql in writes if '"durable_checkpoint"' in sql]) == 1
