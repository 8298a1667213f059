"""A body that asks for other than its history holds parks its run (ON_NONDETERMINISM "park", the
default) instead of failing it: nothing of the turn is written, its turns are retried with a
backoff and at every worker start, and the admin, a lifecycle signal and ``manage.py durable
replay`` say where it is blocked and what to do. "fail" keeps the old behaviour."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.urls import reverse

import durable
from durable import checks, clock, conf, signals
from durable.engine import blocked
from durable.models import Checkpoint, Run, Signal

pytestmark = pytest.mark.django_db

#: The code deployed now: "good" asks for ``prepare`` first, "bad" for a step random picks.
CODE = {"deployed": "good"}


@pytest.fixture(autouse=True)
def _good_code():
    CODE["deployed"] = "good"
    yield
    CODE["deployed"] = "good"


@durable.step(name="tests.nondet.prepare")
def prepare(n: int) -> int:
    return n


@durable.step(name="tests.nondet.prepare_eu")
def prepare_eu(n: int) -> int:
    return n


@durable.step(name="tests.nondet.prepare_us")
def prepare_us(n: int) -> int:
    return n


@durable.step(name="tests.nondet.finish")
def finish(n: int, go: str) -> str:
    return f"{n} {go}"


def first_step() -> Any:
    if CODE["deployed"] == "good":
        return prepare
    # What the mistaken deploy does: neither of its choices is what the history holds.
    import random

    return random.choice([prepare_eu, prepare_us])


@durable.workflow(name="tests.nondet.order")
def order(ctx, n):
    ctx.step(first_step(), n)
    go = ctx.wait_for_signal("go")
    return ctx.step(finish, n, go)


@durable.workflow(name="tests.nondet.catching")
def catching(ctx, n):
    try:
        ctx.step(first_step(), n)
    except durable.NonDeterminismError:
        return "swallowed"
    return ctx.step(finish, n, ctx.wait_for_signal("go"))


def parked_run(durable_env: Any, flow: Any = order) -> str:
    """A run recorded by the good code, waiting for its signal, then signalled under the bad."""
    run = durable.start(flow, 7)
    durable_env.run_until_idle()
    assert Run.objects.get(id=run.id).status == "suspended"
    CODE["deployed"] = "bad"
    durable.signal(run.id, "go", "went")
    durable_env.run_until_idle()
    return run.id


def history(run_id: str) -> list[tuple]:
    return list(
        Checkpoint.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", "kind", "name", "status", "attempt", "output")
    )


def test_a_run_whose_body_asks_for_other_than_its_history_is_parked_with_nothing_written(durable_env):
    run = durable.start(order, 7)
    durable_env.run_until_idle()
    before = history(run.id)
    CODE["deployed"] = "bad"
    durable.signal(run.id, "go", "went")
    parked_at = clock.now()
    durable_env.run_until_idle()

    row = Run.objects.get(id=run.id)
    assert (row.status, row.locked_by, row.locked_until, row.finished_at) == ("suspended", None, None, None)
    assert row.error["code"] == "non_determinism"
    details = row.error["details"]
    assert (details["seq"], details["recorded"], details["parked"]) == (0, ["step", prepare.name], 1)
    assert details["requested"][1] in (prepare_eu.name, prepare_us.name)
    assert history(run.id) == before  # nothing of the blocked turn is written
    assert Signal.objects.get(run_id=run.id).consumed_seq is None  # the signal waits for the fix
    assert row.wake_at == parked_at + blocked.FIRST_RETRY

    CODE["deployed"] = "good"  # the fix is deployed: the next try resumes the run by itself
    durable_env.advance_time("5s")
    assert durable.result(run.id) == "7 went"
    assert Run.objects.get(id=run.id).error is None


def test_the_fail_setting_fails_the_run_as_before(durable_env):
    with override_settings(DURABLE={"ON_NONDETERMINISM": "fail"}):
        run_id = parked_run(durable_env)
        row = Run.objects.get(id=run_id)
    assert row.status == "failed"
    assert row.error["code"] == "non_determinism"


def test_a_bad_on_nondeterminism_value_is_a_system_check_error_and_park_and_fail_are_accepted():
    with override_settings(DURABLE={"ON_NONDETERMINISM": "retry"}):
        found = checks.check_settings()
        assert [m.id for m in found] == ["durable.E001"]
        assert "ON_NONDETERMINISM" in found[0].msg and '"park"' in found[0].msg and '"fail"' in found[0].msg
        assert conf.load().ON_NONDETERMINISM == "park"  # a bad value falls back to the default
    for value in ("park", "fail"):
        with override_settings(DURABLE={"ON_NONDETERMINISM": value}):
            assert checks.check_settings() == []
            assert value == conf.load().ON_NONDETERMINISM


def test_a_body_that_catches_the_error_still_parks(durable_env):
    run_id = parked_run(durable_env, catching)
    row = Run.objects.get(id=run_id)
    assert row.status == "suspended"
    assert row.error["code"] == "non_determinism"


def test_a_parked_run_is_retried_with_a_doubling_backoff_up_to_the_reconcile_interval(durable_env):
    run_id = parked_run(durable_env)
    gaps = []
    for _ in range(8):
        row = Run.objects.get(id=run_id)
        gaps.append((row.wake_at - row.updated_at).total_seconds())
        durable_env.advance_time(row.wake_at - clock.now())
    assert gaps == [5, 10, 20, 40, 80, 160, 300, 300]  # RECONCILE_INTERVAL is 5 minutes
    assert Run.objects.get(id=run_id).error["details"]["parked"] == 9


def test_a_parked_run_spends_no_recovery_budget_and_never_goes_dead(durable_env):
    with override_settings(DURABLE={"MAX_RECOVERY_ATTEMPTS": 1}):
        run_id = parked_run(durable_env)
        for _ in range(4):
            durable_env.advance_time("5m")
        row = Run.objects.get(id=run_id)
    assert (row.status, row.recovery_attempts) == ("suspended", 0)
    assert row.error["details"]["parked"] == 5


def test_a_parked_run_can_be_cancelled(durable_env):
    run_id = parked_run(durable_env)
    durable.cancel(run_id, reason="giving up")
    assert Run.objects.get(id=run_id).status == "cancelled"


def test_a_starting_worker_sends_the_parked_runs_of_its_workflows_a_turn(durable_env):
    run_id = parked_run(durable_env)
    CODE["deployed"] = "good"

    sent = blocked.resume_registered(conf.get())

    assert sent == 1
    assert Run.objects.get(id=run_id).wake_at == clock.now() + conf.get().LEASE  # if the message is lost
    durable_env.run_until_idle()  # the turn it sent, before the backoff's 5 s
    assert durable.result(run_id) == "7 went"


def test_a_starting_worker_takes_parked_runs_in_bounded_batches(durable_env):
    runs = [durable.start(order, n).id for n in range(5)]
    durable_env.run_until_idle()
    CODE["deployed"] = "bad"
    for run_id in runs:
        durable.signal(run_id, "go", "went")
    durable_env.run_until_idle()
    assert Run.objects.blocked().count() == 5
    CODE["deployed"] = "good"

    with override_settings(DURABLE={"TIMER_BATCH_SIZE": 2}):
        assert blocked.resume_registered(conf.get()) == 5
    durable_env.run_until_idle()
    assert [durable.result(run_id) for run_id in runs] == [f"{n} went" for n in range(5)]


def test_a_blocked_turn_sends_run_blocked_with_where_and_what_to_do(durable_env):
    heard = []

    def receive(sender, **kwargs):
        heard.append(kwargs)

    signals.run_blocked.connect(receive, weak=False)
    try:
        run_id = parked_run(durable_env)
    finally:
        signals.run_blocked.disconnect(receive)
    assert len(heard) == 1
    assert heard[0]["run_id"] == run_id and heard[0]["status"] == "suspended"
    assert heard[0]["error"]["details"]["seq"] == 0
    assert heard[0]["wake_at"] == Run.objects.get(id=run_id).wake_at
    message = heard[0]["reason"]
    assert message.startswith("blocked by non-determinism at position 0: the history holds step")
    assert "random" in message and "ctx.random()" in message and "ctx.patched()" in message
    assert "resumes by itself" in message


def test_the_run_page_and_the_run_list_filter_show_a_blocked_run(admin_client: Client, durable_env):
    run_id = parked_run(durable_env)
    CODE["deployed"] = "good"
    fine = durable.start(order, 8).id
    durable_env.run_until_idle()

    page = admin_client.get(reverse("admin:durable_run_change", args=[quote(run_id)])).content.decode()
    assert "Stuck: </strong>blocked by non-determinism at position 0" in page
    assert "ctx.random()" in page

    listed = admin_client.get(reverse("admin:durable_run_changelist"), {"blocked": "non_determinism"})
    html = listed.content.decode()
    assert "blocked by non-determinism" in html
    assert run_id in html and fine not in html


def test_the_health_page_counts_and_lists_blocked_runs(admin_client: Client) -> None:
    # No durable_env: its frozen clock would stop the broker calls' timeouts (Celery's ping).
    now = clock.now()
    error = {
        "message": "...",
        "type": "NonDeterminismError",
        "code": "non_determinism",
        "details": {"seq": 3, "recorded": ["step", "a"], "requested": ["sleep", "sleep"], "parked": 2},
    }
    for i, status in enumerate(["suspended", "failed"]):
        Run.objects.create(
            id=f"parked-{i}",
            workflow="tests.nondet.order",
            version="1",
            queue="durable",
            status=status,
            error=error,
            created_at=now,
            updated_at=now,
            wake_at=now + timedelta(seconds=5),
        )

    html = admin_client.get(reverse("admin:durable_presence_changelist")).content.decode()

    assert "runs blocked by non-determinism" in html
    assert '?blocked=non_determinism">1</a>' in html  # the failed run is not blocked: it ended
    assert "parked-0" in html and "parked-1" not in html
    assert (
        "blocked by non-determinism at position 3: the history holds step a, the code asked for sleep" in html
    )


def manage(*args: str) -> str:
    out = StringIO()
    call_command("durable", *args, stdout=out)
    return out.getvalue()


def test_replay_names_the_blocked_runs_and_those_the_installed_code_resumes(durable_env):
    run_id = parked_run(durable_env)
    CODE["deployed"] = "good"
    fine = durable.start(order, 8).id
    durable_env.run_until_idle()

    out = manage("replay")
    assert f"RESUMES {run_id} tests.nondet.order@1" in out
    assert "deploy it and the run resumes by itself" in out
    assert fine not in out
    assert "replayed 2 stored histories: 0 would break; 1 blocked by non-determinism now, 1 of them" in out

    CODE["deployed"] = "bad"
    with pytest.raises(CommandError) as refused:
        call_command("durable", "replay", "--run", run_id, stdout=(out := StringIO()))
    assert f"BLOCKED {run_id} tests.nondet.order@1" in out.getvalue()
    assert "blocked by non-determinism at position 0" in out.getvalue()
    assert "1 would break; 1 blocked by non-determinism now, 0 of them replay on this code" in str(
        refused.value
    )
