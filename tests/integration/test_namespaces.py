"""Namespaces: a run's turns and steps go to its namespace's queues, its children and successors
stay in it, and a worker or beat with DURABLE["NAMESPACE"] sweeps only its own runs (one without
sweeps them all)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import durable
from durable.engine import retention, schedules, sweeps
from durable.models import Checkpoint, CronSchedule, Run
from tests.transitions import forging

pytestmark = pytest.mark.django_db


@durable.step
def ns_step(n: int) -> int:
    return n + 1


@durable.workflow(name="tests.ns.child")
def ns_child(ctx: durable.Context, n: int) -> int:
    return ctx.step(ns_step, n)


@durable.workflow(name="tests.ns.parent")
def ns_parent(ctx: durable.Context, n: int) -> int:
    if n >= 2:
        return ctx.child(ns_child, n)
    ctx.continue_as_new(n + 1)


@durable.workflow(name="tests.ns.sleeper")
def ns_sleeper(ctx: durable.Context, _: object) -> str:
    ctx.sleep("1h")
    return "woke"


def _only(namespace: str | None):
    return override_settings(DURABLE={"NAMESPACE": namespace})


def test_a_namespaced_run_its_steps_children_and_successors_use_the_namespace_queues(durable_env):
    first = durable.start(ns_parent, 1, namespace="tenant-a")
    assert [m.queue for m in durable_env.pending()] == ["durable.tenant-a"]
    durable_env.run_until_idle()
    runs = list(Run.objects.order_by("created_at", "id"))
    assert {r.namespace for r in runs} == {"tenant-a"}
    assert {r.queue for r in runs} == {"durable.tenant-a"}
    assert Checkpoint.objects.get(run__workflow="tests.ns.child", kind="step").queue == "durable.tenant-a"
    assert durable.result(first.id) == 3  # followed through continue-as-new to the child's result


def test_a_run_in_no_namespace_uses_the_queues_as_named(durable_env):
    run = durable.start(ns_child, 1)
    durable_env.run_until_idle()
    assert Run.objects.get(id=run.id).queue == "durable"
    assert Checkpoint.objects.get(run_id=run.id).queue == "durable"


def test_durable_namespace_setting_places_runs_started_without_one(durable_env):
    with _only("tenant-b"):
        run = durable.start(ns_child, 1)
    assert (Run.objects.get(id=run.id).namespace, Run.objects.get(id=run.id).queue) == (
        "tenant-b",
        "durable.tenant-b",
    )


def test_the_timer_sweep_of_a_namespace_wakes_only_its_runs(durable_env):
    a = durable.start(ns_sleeper, namespace="tenant-a")
    b = durable.start(ns_sleeper, namespace="tenant-b")
    durable_env.run_until_idle()
    Run.objects.update(wake_at=durable_env.now())  # both timers due
    with _only("tenant-b"):
        assert sweeps.sweep_timers() == 1
    assert [m.args for m in durable_env.pending()] == [(b.id,)]
    assert [m.queue for m in durable_env.pending()] == ["durable.tenant-b"]
    with _only(None):
        assert sweeps.sweep_timers() == 1  # the one left: tenant-a's
    assert [m.args for m in durable_env.pending()] == [(b.id,), (a.id,)]


def test_the_orphan_sweep_of_a_namespace_recovers_only_its_runs(durable_env):
    a = durable.start(ns_sleeper, namespace="tenant-a")
    b = durable.start(ns_sleeper, namespace="tenant-b")
    durable_env.run_until_idle()
    past = durable_env.now() - timedelta(minutes=1)
    with forging():
        Run.objects.update(status="running", locked_by="dead/1", locked_until=past)
    with _only("tenant-a"):
        assert sweeps.sweep_orphans() == 1
    assert Run.objects.get(id=a.id).status == "suspended"
    assert Run.objects.get(id=b.id).status == "running"


def test_retention_of_a_namespace_deletes_only_its_runs(durable_env):
    a = durable.start(ns_child, 1, namespace="tenant-a")
    b = durable.start(ns_child, 1, namespace="tenant-b")
    durable_env.run_until_idle()
    # Past the policy by more than retention.DAY_GRACE: on a partitioned history (PostgreSQL) the
    # row by row path leaves a run of a day partition that long to its day's drop.
    Run.objects.update(finished_at=durable_env.now() - timedelta(days=3))
    with override_settings(DURABLE={"NAMESPACE": "tenant-a", "RETENTION": [{"max_age": "1d"}]}):
        assert retention.sweep_retention() == 1
    assert list(Run.objects.values_list("id", flat=True)) == [b.id]
    assert not Run.objects.filter(id=a.id).exists()


def test_a_schedule_starts_its_runs_in_its_namespace_and_only_its_beat_fires_it(durable_env):
    durable.schedule("ns-report", ns_child, cron="* * * * *", input=1, namespace="tenant-a")
    assert CronSchedule.objects.get(key="ns-report").namespace == "tenant-a"
    CronSchedule.objects.update(next_at=durable_env.now())
    with _only("tenant-b"):
        assert schedules.sweep_schedules() == 0
    with _only("tenant-a"):
        assert schedules.sweep_schedules() == 1
    run = Run.objects.get(workflow="tests.ns.child")
    assert (run.namespace, run.queue) == ("tenant-a", "durable.tenant-a")
    handle = durable.trigger_schedule("ns-report")
    assert Run.objects.get(id=handle.id).namespace == "tenant-a"


@pytest.mark.parametrize("bad", ["tenant a", "tenant@a", "tenant.a", "ténant"])
def test_a_namespace_that_cannot_name_a_queue_is_refused_before_anything_is_stored(durable_env, bad):
    with pytest.raises(durable.InvalidInput, match="namespace may hold only letters, digits"):
        durable.start(ns_child, 1, namespace=bad)
    with pytest.raises(durable.InvalidInput, match="namespace may hold only letters, digits"):
        durable.schedule("ns-bad", ns_child, cron="* * * * *", namespace=bad)
    assert not Run.objects.exists() and not CronSchedule.objects.exists()
