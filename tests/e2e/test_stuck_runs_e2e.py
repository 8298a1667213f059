"""Stuck runs explain themselves, on real processes: a worker that does not consume the run's
queue, no beat, a workflow the worker never imported, a step waiting for a concurrency slot.
Each cause is named by durable.engine.diagnosis (and the run page) within a sweep interval or
two of when it starts to hold the run back, and goes away once the cause is fixed."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse

import durable
from durable import clock
from durable.engine.diagnosis import explain
from durable.models import Presence, Run
from durable.testing import settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

#: Set in the workers' environment only: what the test process registers and they do not.
WORKER_SIDE = "DURABLE_E2E_STUCK_WORKER"
TOKENS = Path(tempfile.gettempdir()) / "durable-e2e-stuck-tokens"
#: Short heartbeats, so a worker's presence and absence show within seconds; no countdowns, so
#: a due timer waits for beat.
SETTINGS = {"PRESENCE_INTERVAL": "1s", "TIMER_SWEEP_INTERVAL": "1s", "TIMER_HINT_WITHIN": "0s"}
HEALTH = "admin:durable_presence_changelist"


@durable.step
def echo(value: Any) -> Any:
    return value


@durable.step(name="tests.e2e_stuck.one_at_a_time", concurrency=1)
def one_at_a_time(n: int) -> None:
    TOKENS.mkdir(exist_ok=True)
    (TOKENS / f"{durable.step_info().run_id}-{n}").write_text(durable.step_info().token)
    raise durable.CompleteLater()


@durable.workflow(name="tests.e2e_stuck.echo")
def echo_flow(ctx: durable.Context, value: Any) -> Any:
    return ctx.step(echo, value)


@durable.workflow(name="tests.e2e_stuck.nap")
def nap_flow(ctx: durable.Context, seconds: str) -> str:
    ctx.sleep(seconds)
    return ctx.step(echo, "rested")


@durable.workflow(name="tests.e2e_stuck.limited")
def limited_flow(ctx: durable.Context, n: int) -> Any:
    return ctx.all([ctx.defer(one_at_a_time, i) for i in range(n)])


if not os.environ.get(WORKER_SIDE):

    @durable.workflow(name="tests.e2e_stuck.web_only", version="2")
    def web_only_flow(ctx: durable.Context, value: Any) -> Any:
        return value


@pytest.fixture
def durable_worker_options() -> dict[str, Any]:
    env = settings_env(SETTINGS)
    return {"start": False, "env": {**env, WORKER_SIDE: "1"}}


@pytest.fixture(autouse=True)
def _short_heartbeats() -> Any:
    with override_settings(DURABLE=SETTINGS):
        yield


def _stuck(run_id: str) -> dict[str, str]:
    return {r.code: r.message for r in explain(Run.objects.get(id=run_id)) if r.stuck}


def _sweep_row(html: str, task: str) -> str:
    return html.split(f"<tr><td>{task}</td>", 1)[1].split("</tr>", 1)[0]


def _worker_noted() -> bool:
    return Presence.objects.filter(kind=Presence.WORKER).exists()


def test_a_worker_without_the_runs_queue_warns_at_start_and_the_run_says_why_it_waits(
    durable_worker: Any, admin_client: Client
) -> None:
    elsewhere = durable_worker.add_worker(queues=["celery"], name="elsewhere")
    assert "does not consume 'durable'" in elsewhere.logs()
    wait_for(_worker_noted, 30, what="the worker to note itself")
    run = durable.start(echo_flow, "hello")

    stuck = wait_for(lambda: _stuck(run.id), 30, what="the run to say it is stuck")

    assert list(stuck) == ["no_worker"] and "queue 'durable'" in stuck["no_worker"]
    html = admin_client.get(reverse("admin:durable_run_change", args=[run.id])).content.decode()
    assert "no worker has consumed queue &#x27;durable&#x27; lately" in html
    health = admin_client.get(reverse(HEALTH)).content.decode()
    assert "<tr><td>durable</td><td>1</td><td><strong>no worker: start one with -Q durable</strong>" in health
    durable_worker.primary.start()  # consumes durable: the cause goes, and so does the run
    assert durable.result(run.id, timeout=60) == "hello"
    assert "does not consume" not in durable_worker.primary.logs()


def test_a_worker_stopped_cleanly_is_off_the_health_page_at_once(
    durable_worker: Any, admin_client: Client
) -> None:
    durable_worker.primary.start()
    wait_for(_worker_noted, 30, what="the worker to note itself")
    run_id = durable.start(echo_flow, "hello").id
    assert durable.result(run_id, timeout=60) == "hello"

    # SIGTERM to the group, as systemctl stop: a warm shutdown. The row goes as the shutdown begins
    # (the keeper's next pass), not when it ends: Celery's own takes seconds (5 on the embedded
    # broker), and a prefork pool whose children were signalled too can hang at exit until it is
    # killed (docs/production.md, Deploys). Deleted, not aged out: an aged-out row stays a day.
    durable_worker.primary.signal(signal.SIGTERM, group=True)
    wait_for(
        lambda: not _worker_noted(),
        5,
        interval=0.1,
        what="the worker's row to go",
        explain=lambda: durable_worker.primary.logs()[-4000:],
    )
    durable_worker.primary.stop()
    health = admin_client.get(reverse(HEALTH)).content.decode()
    assert "<td>alive</td>" not in health
    waiting = durable.start(echo_flow, "again").id
    assert "no_worker" in _stuck(waiting)


def test_a_due_timer_with_no_beat_running_names_beat_and_goes_on_once_beat_starts(
    durable_worker: Any, admin_client: Client
) -> None:
    durable_worker.primary.start()
    run = durable.start(nap_flow, "1s")
    wait_for(lambda: Run.objects.get(id=run.id).status == "suspended", 60, what="the run to sleep")
    due = Run.objects.get(id=run.id).wake_at
    assert not _stuck(run.id)

    stuck = wait_for(lambda: _stuck(run.id), 30, interval=0.2, what="the run to name beat")

    # Named within two timer-sweep intervals of its due time (plus this poll's slack).
    assert (clock.now() - due).total_seconds() < 2 + 3
    assert list(stuck) == ["no_beat"] and "celery beat" in stuck["no_beat"]
    health = admin_client.get(reverse(HEALTH)).content.decode()
    assert _sweep_row(health, "durable.sweep_timers").endswith(
        "never</td><td></td><td><strong>late: is celery beat running?</strong></td>"
    )
    durable_worker.start_beat()
    assert durable.result(run.id, timeout=60) == "rested"
    health = admin_client.get(reverse(HEALTH)).content.decode()
    assert _sweep_row(health, "durable.sweep_timers").endswith("<td>ok</td>")
    assert Presence.objects.filter(kind=Presence.SWEEP, who="durable.sweep_timers").exists()


def test_a_workflow_the_worker_never_imported_is_named_with_its_version(durable_worker: Any) -> None:
    durable_worker.primary.start()
    wait_for(_worker_noted, 30, what="the worker to note itself")
    run = durable.start("tests.e2e_stuck.web_only", "x")

    stuck = wait_for(lambda: _stuck(run.id), 30, what="the run to say it is stuck")

    assert list(stuck) == ["not_registered"]
    assert "'tests.e2e_stuck.web_only' version '2'" in stuck["not_registered"]
    # The worker did take its turn and leave it: the diagnosis holds after that too.
    wait_for(lambda: "not registered here" in durable_worker.logs(), 60, what="the worker to refuse the run")
    assert list(_stuck(run.id)) == ["not_registered"]


def test_a_step_waiting_for_a_concurrency_slot_says_which_limit(durable_worker: Any) -> None:
    durable_worker.primary.start()
    run = durable.start(limited_flow, 2)

    def waiting() -> dict[str, str]:
        return {code: m for code, m in _stuck(run.id).items() if code == "flow_slot"}

    stuck = wait_for(waiting, 60, what="a member to wait for the slot")

    assert "tests.e2e_stuck.one_at_a_time" in stuck["flow_slot"]
    assert "1 held by other attempts" in stuck["flow_slot"]
    # The holder settles from outside: the slot passes on, and the diagnosis follows it.
    token = wait_for(lambda: next(iter(sorted(TOKENS.glob(f"{run.id}-*"))), None), 30, what="a token")
    durable.complete_step(token.read_text(), "done")
    token.unlink()
    second = wait_for(
        lambda: next(iter(sorted(TOKENS.glob(f"{run.id}-*"))), None), 60, what="the second start"
    )
    deadline = time.monotonic() + 30
    while "flow_slot" in _stuck(run.id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "flow_slot" not in _stuck(run.id)
    durable.complete_step(second.read_text(), "done")
    assert durable.result(run.id, timeout=60) == ["done", "done"]
