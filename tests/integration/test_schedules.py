"""Persisted cron schedules: one run per tick, overlap, pause/resume/trigger, declared in code."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import durable
from durable import clock
from durable.definitions import registry
from durable.engine import schedules
from durable.models import CronSchedule, Run

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.sched_report")
def report(ctx, day):
    return {"day": day}


@durable.workflow(name="tests.sched_slow")
def slow(ctx, _):
    ctx.sleep("2h")
    return "done"


def _runs(prefix="schedule:"):
    return sorted(Run.objects.filter(id__startswith=prefix).values_list("id", flat=True))


@pytest.fixture
def at_noon(durable_env):
    durable_env._freezer.move_to(datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC))
    return durable_env


def test_each_tick_starts_one_run_named_after_it(at_noon):
    durable.schedule("report", report, cron="*/5 * * * *", input="mon")
    assert at_noon.sweep() == 0  # the first tick is 12:05
    at_noon.advance_time("5m")
    assert _runs() == ["schedule:report:2026-12-01T12:05:00+00:00"]
    assert durable.result(_runs()[0]) == {"day": "mon"}
    at_noon.advance_time("5m")
    assert len(_runs()) == 2
    assert schedules.sweep_schedules() == 0  # nothing due: the same tick never starts twice


def test_ticks_missed_while_no_beat_ran_start_only_the_latest(at_noon):
    durable.schedule("report", report, cron="*/5 * * * *")
    at_noon.advance_time("1h")
    assert _runs() == ["schedule:report:2026-12-01T13:00:00+00:00"]
    assert CronSchedule.objects.get(key="report").next_at == datetime(2026, 12, 1, 13, 5, tzinfo=UTC)


def test_two_sweeps_on_one_due_tick_start_one_run(at_noon):
    durable.schedule("report", report, cron="*/5 * * * *")
    at_noon._freezer.tick(300)
    row = CronSchedule.objects.get(key="report")
    assert schedules._fire(row, clock.now()) is True
    assert schedules._fire(row, clock.now()) is False  # a second sweep holding the stale row
    assert len(_runs()) == 1


def test_overlap_skip_starts_nothing_while_the_last_run_is_going(at_noon):
    durable.schedule("slow", slow, cron="0 * * * *")
    at_noon.advance_time("30m")
    at_noon.advance_time("1h")  # 14:00: the 13:00 run still sleeps
    assert len(_runs()) == 1
    durable.schedule("slow", slow, cron="0 * * * *", overlap="allow")
    at_noon.advance_time("1h")
    assert len(_runs()) == 2


def test_pause_resume_and_trigger(at_noon):
    durable.schedule("report", report, cron="*/5 * * * *")
    assert durable.pause_schedule("report") is True
    assert durable.pause_schedule("report") is False
    at_noon.advance_time("1h")
    assert _runs() == []
    assert durable.resume_schedule("report") is True
    assert CronSchedule.objects.get(key="report").next_at == datetime(2026, 12, 1, 13, 5, tzinfo=UTC)
    handle = durable.trigger_schedule("report")
    assert handle.id == "schedule:report:2026-12-01T13:00:30+00:00"
    at_noon.run_until_idle()
    assert durable.result(handle.id) == {"day": None}


@pytest.fixture
def nightly():
    """A workflow declaring its schedule, registered for one test only: beat (and durable_env's
    sweeps) would start it in every test that moves the clock past 02:00 UTC."""
    spec = durable.Schedule("0 3 * * *", input="night", timezone="Europe/Paris")
    definition = durable.workflow(lambda ctx, what: what, name="tests.sched_nightly", schedule=spec)
    yield definition
    registry.workflows.pop("tests.sched_nightly")


def test_a_schedule_declared_on_the_workflow_follows_the_code(at_noon, nightly, monkeypatch):
    schedules.sync_declared()
    row = CronSchedule.objects.get(key="tests.sched_nightly")
    # 03:00 in Paris is 02:00 UTC in December.
    assert (row.declared, row.next_at, row.input) == (True, datetime(2026, 12, 2, 2, 0, tzinfo=UTC), "night")
    at_noon.advance_time("15h")
    assert _runs() == ["schedule:tests.sched_nightly:2026-12-02T02:00:00+00:00"]
    monkeypatch.setattr(nightly, "schedule", None)  # the code no longer declares it
    schedules.sync_declared()
    assert not CronSchedule.objects.filter(key="tests.sched_nightly").exists()


def test_syncing_the_declared_schedules_writes_only_what_changed(at_noon, nightly, django_assert_num_queries):
    """Every sweep passes every registered workflow; those that declare nothing new cost no
    statement (no savepoint each), however many the project registers."""
    schedules.sync_declared()
    assert len(registry.workflows) > 5
    with django_assert_num_queries(1):  # the declared rows, read once
        schedules.sync_declared()
    before = CronSchedule.objects.get(key="tests.sched_nightly").updated_at
    at_noon.advance_time("1m")
    schedules.sync_declared()
    assert CronSchedule.objects.get(key="tests.sched_nightly").updated_at == before


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"cron": "every day"}, "cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "IANA name"),
        ({"cron": "* * * * *", "overlap": "queue"}, "overlap must be one of"),
        ({"cron": "* * * * *", "input": {"total": float("nan")}}, "at total is the float nan"),
        ({"cron": "* * * * *", "input": object()}, "is an instance of object, which has no JSON form"),
    ],
)
def test_bad_schedules_are_refused_before_anything_is_stored(durable_env, kwargs, says):
    with pytest.raises(durable.InvalidInput, match=says):
        durable.schedule("report", report, **kwargs)
    assert not CronSchedule.objects.filter(key="report").exists()


def test_unknown_workflows_and_keys_are_refused(durable_env):
    with pytest.raises(durable.WorkflowNotRegistered):
        durable.schedule("x", "tests.no_such_workflow", cron="* * * * *")
    with pytest.raises(durable.InvalidInput, match="no schedule has the key"):
        durable.trigger_schedule("nope")
    with pytest.raises(durable.InvalidInput, match="schedule= takes a cron string"):
        durable.workflow(lambda ctx, _: None, name="tests.sched_bad", schedule=5)


@durable.workflow(name="tests.sched_picky", validate_input=lambda value: value == "ok" or 1 / 0)
def picky(ctx, value):
    return value


def test_a_tick_whose_run_cannot_start_is_skipped_and_the_others_still_fire(at_noon):
    durable.schedule("picky", picky, cron="*/5 * * * *", input="ok")
    durable.schedule("report", report, cron="*/5 * * * *")
    CronSchedule.objects.filter(key="picky").update(input="refused")  # the workflow no longer takes it
    at_noon.advance_time("5m")
    assert _runs() == ["schedule:report:2026-12-01T12:05:00+00:00"]
    assert CronSchedule.objects.get(key="picky").next_at == datetime(2026, 12, 1, 12, 10, tzinfo=UTC)


def test_a_cron_that_never_fires_is_refused_at_declaration(durable_env):
    with pytest.raises(durable.InvalidInput, match="never fires"):
        durable.schedule("feb30", report, cron="0 0 30 2 *")
    with pytest.raises(durable.InvalidInput, match="never fires"):
        durable.Schedule("0 0 30 2 *")
    with pytest.raises(durable.InvalidInput, match="never fires"):
        durable.workflow(lambda ctx, _: None, name="tests.sched_feb30", schedule="0 0 30 2 *")
    assert "tests.sched_feb30" not in registry.workflows
    assert not CronSchedule.objects.exists()


def _stored(key, cron, workflow="tests.sched_report", declared=False):
    """A row as an older version (or a hand edit) left it, past today's checks."""
    now = clock.now()
    CronSchedule.objects.create(
        key=key, workflow=workflow, cron=cron, next_at=now, declared=declared, created_at=now, updated_at=now
    )


def test_a_stored_cron_that_never_fires_does_not_stop_the_other_schedules(at_noon, caplog):
    _stored("feb30", "0 0 30 2 *")
    durable.schedule("report", report, cron="*/5 * * * *")
    at_noon.advance_time("5m")
    assert _runs() == ["schedule:report:2026-12-01T12:05:00+00:00"]
    assert "feb30" in caplog.text
    at_noon.advance_time("5m")
    assert len(_runs()) == 2  # every sweep still fires the good one
    assert durable.pause_schedule("feb30") is True
    with pytest.raises(durable.InvalidInput, match="never fires"):
        durable.resume_schedule("feb30")


def test_a_schedule_whose_workflow_is_gone_does_not_stop_the_others(at_noon):
    _stored("gone", "*/5 * * * *", workflow="tests.sched_no_longer_here")
    durable.schedule("report", report, cron="*/5 * * * *")
    at_noon.advance_time("5m")
    assert _runs() == ["schedule:report:2026-12-01T12:05:00+00:00"]


def test_a_declared_schedule_that_cannot_be_saved_does_not_stop_the_sweep(at_noon, nightly, monkeypatch):
    broken = durable.Schedule("0 3 * * *")
    object.__setattr__(broken, "cron", "0 0 30 2 *")  # as if declared before such crons were refused
    monkeypatch.setattr(nightly, "schedule", broken)
    durable.schedule("report", report, cron="*/5 * * * *")
    at_noon.advance_time("5m")
    assert _runs() == ["schedule:report:2026-12-01T12:05:00+00:00"]
    assert not CronSchedule.objects.filter(key="tests.sched_nightly").exists()


@durable.workflow(name="tests.sched_typed")
def typed_report(ctx, given):
    return {"given": given, "types": [type(part).__name__ for part in given]}


def test_a_schedules_input_reaches_each_run_with_its_types(at_noon):
    from decimal import Decimal

    given = ((2026, 12), Decimal("1.50"), {"mon", "tue"})
    durable.schedule("typed", typed_report, cron="*/5 * * * *", input=given)
    at_noon.advance_time("5m")
    at_noon.run_until_idle()
    ticked = durable.trigger_schedule("typed")
    at_noon.run_until_idle()
    ran = Run.objects.filter(id__startswith="schedule:typed:").order_by("id")
    assert ran.count() == 2
    for run in ran:
        assert durable.result(run.id) == {"given": given, "types": ["tuple", "Decimal", "set"]}
    assert ticked.id in {run.id for run in ran}
