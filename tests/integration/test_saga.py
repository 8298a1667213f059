"""Sagas through durable_env: compensations on failure and on a compensating cancel."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

LOG: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    LOG.clear()


@durable.step
def reserve(item):
    LOG.append(f"reserve {item}")
    return f"res-{item}"


@reserve.compensation
def release(reservation, item):
    LOG.append(f"release {reservation} {item}")


@durable.step(local=True)
def note(text):
    LOG.append(f"note {text}")
    return text


@note.compensation
def unnote(result, text):
    LOG.append(f"unnote {text}")


@durable.step(retry=durable.Retry(max_attempts=2, initial="1s"))
def charge(amount):
    LOG.append(f"charge {amount}")
    if amount > 100:
        raise durable.ApplicationError("card declined", code="declined", non_retryable=True)
    return "ch-1"


@durable.step(retry=durable.Retry(max_attempts=2, initial="1s"))
def unreliable_reserve(item):
    return item


@unreliable_reserve.compensation
def broken_release(result, item):
    LOG.append("broken release")
    raise RuntimeError("the warehouse is down")


@durable.workflow(name="tests.saga_order")
def order_flow(ctx, amount):
    ctx.step(reserve, "a")
    ctx.step(note, "reserved a")
    ctx.step(reserve, "b")
    ctx.step(charge, amount)
    return ctx.wait_for_signal("shipped")


@durable.workflow(name="tests.saga_broken")
def broken_flow(ctx, _):
    ctx.step(reserve, "a")
    ctx.step(unreliable_reserve, "b")
    raise durable.ApplicationError("give up", code="gave_up")


def test_failure_runs_compensations_newest_first_then_fails(durable_env):
    run = durable.start(order_flow, 500)
    durable_env.run_until_idle()
    assert LOG == [
        "reserve a",
        "note reserved a",
        "reserve b",
        "charge 500",
        "release res-b b",
        "unnote reserved a",
        "release res-a a",
    ]
    record = durable.get_run(run.id)
    assert (record.status, record.error["code"]) == ("failed", "declined")
    kinds = list(Checkpoint.objects.filter(run_id=run.id, kind="compensation").values_list("name", "status"))
    assert kinds == [
        ("compensate:" + reserve.name, "completed"),
        ("compensate:" + note.name, "completed"),
        ("compensate:" + reserve.name, "completed"),
    ]
    with pytest.raises(durable.DurableError, match="compensated"):
        durable.retry(run.id)


def test_a_compensation_that_fails_for_good_does_not_stop_the_others(durable_env):
    run = durable.start(broken_flow)
    durable_env.run_until_idle()
    durable_env.advance_time("5s")  # the failing compensation's retry
    assert LOG == ["reserve a", "broken release", "broken release", "release res-a a"]
    record = durable.get_run(run.id)
    assert (record.status, record.error["code"]) == ("failed", "compensation_failed")


def test_compensating_cancel_unwinds_then_cancels(durable_env):
    run = durable.start(order_flow, 10)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"  # waiting for "shipped"
    assert durable.cancel(run.id, compensate=True, reason="customer cancelled") is True
    durable_env.run_until_idle()
    assert [e for e in LOG if e.startswith(("release", "unnote"))] == [
        "release res-b b",
        "unnote reserved a",
        "release res-a a",
    ]
    record = durable.get_run(run.id)
    assert (record.status, record.error["code"], record.error["message"]) == (
        "cancelled",
        "cancelled",
        "customer cancelled",
    )


def test_step_completing_after_a_compensating_cancel_is_compensated(durable_env):
    run = durable.start(order_flow, 10)
    durable_env.run_next()  # turn: dispatch reserve a
    durable.cancel(run.id, compensate=True)
    durable_env.run_until_idle()  # reserve a completes after the cancel, then is undone
    assert LOG == ["reserve a", "release res-a a"]
    assert durable.get_run(run.id).status == "cancelled"


def test_cancel_intent_survives_a_lost_message(durable_env):
    run = durable.start(order_flow, 10)
    durable_env.run_until_idle()
    durable.cancel(run.id, compensate=True)
    durable_env.drop()  # the worker that should unwind never hears of it
    assert durable.get_run(run.id).cancel_request == {"reason": None}
    durable_env.advance_time("1m")
    assert durable.get_run(run.id).status == "cancelled"
    assert "release res-a a" in LOG


def test_compensating_cancel_of_a_finished_run_is_refused(durable_env):
    run = durable.start(order_flow, 10)
    durable_env.run_until_idle()
    durable.signal(run.id, "shipped", True)
    durable_env.run_until_idle()
    assert durable.cancel(run.id, compensate=True) is False
    assert not Run.objects.filter(id=run.id, cancel_request__isnull=False).exists()
