"""A stuck run explains itself (durable.engine.diagnosis) on its admin page, and the health page
sums up queues, workers, sweeps and due timers; driven with durable_env and Presence rows as
workers and beat write them (the real processes are in tests/e2e/test_stuck_runs_e2e.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

import durable
from durable import clock
from durable.engine import presence
from durable.engine.diagnosis import explain
from durable.models import Presence, Run

pytestmark = pytest.mark.django_db

HEALTH = "admin:durable_presence_changelist"


@durable.step
def echo(n: int) -> int:
    return n


@durable.step(name="tests.diagnosis_one_at_a_time", concurrency=1)
def one_at_a_time(n: int) -> None:
    raise durable.CompleteLater()


@durable.step(name="tests.diagnosis_rated", rate_limit="1/h")
def rated(n: int) -> int:
    return n


@durable.workflow(name="tests.diagnosis_rated")
def rated_flow(ctx: durable.Context, n: int) -> None:
    ctx.all([ctx.defer(rated, i) for i in range(n)])


@durable.workflow(name="tests.diagnosis_echo", version="3")
def echo_flow(ctx: durable.Context, n: int) -> int:
    return ctx.step(echo, n)


@durable.workflow(name="tests.diagnosis_nap")
def nap_flow(ctx: durable.Context, _: Any) -> None:
    ctx.sleep("5s")


@durable.workflow(name="tests.diagnosis_limited")
def limited_flow(ctx: durable.Context, n: int) -> None:
    ctx.all([ctx.defer(one_at_a_time, i) for i in range(n)])


def _worker(queues: list[str], workflows: list[str], *, seen_ago: float = 0) -> None:
    Presence.objects.seen(
        Presence.WORKER,
        f"w-{len(queues)}-{len(workflows)}",
        clock.now() - timedelta(seconds=seen_ago),
        queues=queues,
        workflows=workflows,
    )


def _codes(run_id: str) -> dict[str, str]:
    return {r.code: r.message for r in explain(Run.objects.get(id=run_id)) if r.stuck}


def test_a_run_no_worker_consumes_the_queue_of_says_so(durable_env: Any) -> None:
    run = durable.start(echo_flow, 1)
    _worker(["celery"], ["tests.diagnosis_echo@3"])

    stuck = _codes(run.id)

    assert list(stuck) == ["no_worker"]
    assert "queue 'durable'" in stuck["no_worker"] and "-Q durable" in stuck["no_worker"]


def test_a_worker_silent_for_three_intervals_counts_as_gone(durable_env: Any) -> None:
    run = durable.start(echo_flow, 1)
    _worker(["durable"], ["tests.diagnosis_echo@3"], seen_ago=46)  # PRESENCE_INTERVAL is 15s

    assert "no_worker" in _codes(run.id)
    assert "last seen" in _codes(run.id)["no_worker"]


def test_a_run_whose_workflow_no_worker_has_says_which_name_and_version(durable_env: Any) -> None:
    run = durable.start(echo_flow, 1)
    _worker(["durable"], ["tests.diagnosis_echo@2", "tests.other@1"])

    stuck = _codes(run.id)

    assert list(stuck) == ["not_registered"]
    assert "'tests.diagnosis_echo' version '3'" in stuck["not_registered"]


def test_a_run_served_by_a_worker_that_has_its_workflow_is_not_stuck(durable_env: Any) -> None:
    run = durable.start(echo_flow, 1)
    _worker(["durable"], ["tests.diagnosis_echo@3"])

    reasons = explain(Run.objects.get(id=run.id))

    assert not [r for r in reasons if r.stuck]
    assert "first turn" in reasons[0].message


def test_a_due_timer_and_no_sweep_since_says_beat_is_not_running(durable_env: Any) -> None:
    run = durable.start(nap_flow)
    durable_env.run_until_idle()
    _worker(["durable"], presence.registered_workflows())
    assert not _codes(run.id)

    durable_env._freezer.tick(timedelta(seconds=8))  # past the timer, without sweeping

    stuck = _codes(run.id)
    assert list(stuck) == ["no_beat"]
    assert "celery beat" in stuck["no_beat"] and "no timer sweep recorded" in stuck["no_beat"]
    presence.sweep_ran("durable.sweep_timers", 0)
    assert "no_beat" not in _codes(run.id)


def test_a_due_timer_whose_sweeps_no_worker_consumes_names_the_queue_not_beat(durable_env: Any) -> None:
    run = durable.start(nap_flow)
    durable_env.run_until_idle()
    _worker(["reports"], presence.registered_workflows())  # beat runs; nobody takes its sweeps
    durable_env._freezer.tick(timedelta(seconds=8))

    stuck = _codes(run.id)

    assert "no_beat" not in stuck
    assert "timer sweep has not run" in stuck["no_worker"]
    assert "queue 'durable', which no worker consumes" in stuck["no_worker"]


def test_a_namespaced_beat_counts_for_the_runs_of_its_namespace_only(durable_env: Any) -> None:
    ours = durable.start(nap_flow, namespace="tenant-a")
    theirs = durable.start(nap_flow, namespace="tenant-b")
    durable_env.run_until_idle()
    _worker(["durable.tenant-a", "durable.tenant-b"], presence.registered_workflows())
    durable_env._freezer.tick(timedelta(seconds=8))

    with override_settings(DURABLE={"NAMESPACE": "tenant-a"}):
        presence.sweep_ran("durable.sweep_timers", 0)

    assert "no_beat" not in _codes(ours.id)
    assert "no_beat" in _codes(theirs.id)


def test_a_step_waiting_for_a_concurrency_slot_says_so(durable_env: Any) -> None:
    run = durable.start(limited_flow, 2)
    durable_env.run_until_idle()
    _worker(["durable"], presence.registered_workflows())

    stuck = _codes(run.id)

    assert list(stuck) == ["flow_slot"]
    assert "tests.diagnosis_one_at_a_time" in stuck["flow_slot"]
    assert "1 held by other attempts, 0 ahead in line" in stuck["flow_slot"]


def test_a_step_waiting_for_a_rate_token_says_until_when(durable_env: Any) -> None:
    run = durable.start(rated_flow, 2)
    durable_env.run_until_idle()
    _worker(["durable"], presence.registered_workflows())

    stuck = _codes(run.id)

    assert list(stuck) == ["rate_token"]
    assert "rate limit 'r:tests.diagnosis_rated' until" in stuck["rate_token"]


def test_a_finished_run_waits_for_nothing(durable_env: Any) -> None:
    run = durable.start(echo_flow, 1)
    durable_env.run_until_idle()
    assert explain(Run.objects.get(id=run.id)) == []


def test_the_run_page_says_what_the_run_waits_for(admin_client: Client, durable_env: Any) -> None:
    run = durable.start(echo_flow, 1)

    html = admin_client.get(reverse("admin:durable_run_change", args=[run.id])).content.decode()

    assert "Cannot progress" in html
    assert "Stuck: </strong>no worker has consumed queue &#x27;durable&#x27; lately" in html


def test_the_health_page_shows_workers_sweeps_queues_and_due_timers(admin_client: Client) -> None:
    # No durable_env: its frozen clock would stop the broker calls' timeouts (Celery's ping).
    now = clock.now()
    Run.objects.create(
        id="napping",
        workflow="tests.diagnosis_nap",
        version="1",
        queue="durable",
        status="suspended",
        created_at=now,
        updated_at=now,
        wake_at=now - timedelta(seconds=8),
    )
    _worker(["durable", "reports"], ["tests.diagnosis_echo@3"])
    presence.sweep_ran("durable.sweep_orphans", 2)

    response = admin_client.get(reverse(HEALTH))

    assert response.status_code == 200
    html = response.content.decode()
    assert '<td id="due-timers">1</td>' in html
    assert "w-2-1" in html and "durable, reports" in html and "alive" in html
    assert "durable.sweep_orphans" in html and "late: is celery beat running?" in html
    assert "<td>durable</td>" in html and "<td>reports</td>" in html
    assert "Celery ping:" in html


def test_the_health_page_blames_a_late_sweep_on_its_unconsumed_queue_not_on_beat(
    admin_client: Client,
) -> None:
    _worker(["reports"], ["tests.diagnosis_echo@3"])
    presence.sweep_ran("durable.sweep_orphans", 2)

    html = admin_client.get(reverse(HEALTH)).content.decode()

    assert "late: no worker consumes queue &#x27;durable&#x27;, where beat sends the sweeps" in html
    assert "is celery beat running?" not in html


def test_the_health_page_needs_the_view_permission(client: Client) -> None:
    User.objects.create_user("clerk", password="pw", is_staff=True)
    client.login(username="clerk", password="pw")
    assert client.get(reverse(HEALTH)).status_code == 403


def test_a_slow_health_query_is_cut_off_and_leaves_the_request_unbounded(
    postgres: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connection, transaction

    from durable_admin import diagnosis

    def slow() -> Any:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(1)")

    def timeout() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            return cursor.fetchone()[0]

    monkeypatch.setattr(diagnosis, "QUERY_TIMEOUT_MS", 50)
    with transaction.atomic():  # as under ATOMIC_REQUESTS
        before = timeout()
        assert diagnosis._time_boxed("default", slow) is diagnosis.TIMED_OUT
        assert diagnosis._time_boxed("default", timeout) == "50ms"
        assert timeout() == before


def test_a_worker_that_shuts_down_cleanly_is_gone_at_once(durable_env: Any) -> None:
    from celery import signals

    run = durable.start(echo_flow, 1)
    presence.announce("celery@shop", ["durable"])
    assert not [r for r in explain(Run.objects.get(id=run.id)) if r.stuck]

    signals.worker_shutdown.send(sender=None)  # what a warm shutdown (TERM, Ctrl-C) sends

    assert not Presence.objects.filter(kind=Presence.WORKER).exists()
    assert "no_worker" in _codes(run.id)  # not "alive" for the next 45 s
    presence.leave()  # once only: a second shutdown signal finds nothing to delete
    presence.tick()  # and the keeper thread, if it still runs, does not write the row again
    assert not Presence.objects.filter(kind=Presence.WORKER).exists()


def test_a_pool_childs_shutdown_leaves_its_workers_row(durable_env: Any) -> None:
    presence.announce("celery@shop", ["durable"])
    main, presence._me = presence._me, ("pid of another process", *presence._me[1:])  # type: ignore[index,assignment]
    try:
        presence.leave()
        assert Presence.objects.filter(kind=Presence.WORKER).count() == 1
    finally:
        presence._me = main
        presence.leave()
