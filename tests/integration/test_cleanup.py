"""Suspension is invisible to the body, through durable_env and with steps run in place: a
``finally`` / ``__exit__`` / ``except BaseException`` on the way out of a suspended turn records
and sends nothing, so cleanup runs once, when the body really leaves the block."""

from __future__ import annotations

import contextlib

import pytest

import durable
from durable import dispatch
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@durable.step(name="r.a")
def a():
    RAN.append("a")
    return "a"


@durable.step(name="r.b")
def b():
    RAN.append("b")
    return "b"


@durable.workflow(name="r.wf")
def wf(ctx, _):
    try:
        ctx.step(a)
        return ctx.step(a)
    finally:
        ctx.step(b)


@contextlib.contextmanager
def tidied(ctx):
    try:
        yield
    finally:
        ctx.step(b)


@durable.workflow(name="tests.cleanup.with")
def with_flow(ctx, _):
    with tidied(ctx):
        ctx.step(a)
        return ctx.step(a)


@durable.workflow(name="tests.cleanup.except_base")
def except_base_flow(ctx, _):
    try:
        ctx.step(a)
        return ctx.step(a)
    except BaseException:  # noqa: BLE001 - a suspension passing through must not run the cleanup
        ctx.step(b)
        raise


def history(run_id):
    return list(Checkpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True))


def sent_steps(env):
    return [m for m in env.pending() if m.task == dispatch.RUN_STEP]


@pytest.mark.parametrize("flow", [wf, with_flow], ids=["finally", "with"])
def test_the_cleanup_reproducer_completes_with_a_a_b_in_order(durable_env, flow):
    run = durable.start(flow)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "a"
    assert history(run.id) == ["r.a", "r.a", "r.b"]
    assert RAN == ["a", "a", "b"]


def test_a_finally_cleanup_is_sent_only_after_the_long_step_ended(durable_env):
    run = durable.start(wf)
    durable_env.run_next()  # the first turn: the long step is sent, the cleanup is not
    assert history(run.id) == ["r.a"]
    assert len(sent_steps(durable_env)) == 1
    durable_env.run_next()  # the step runs, and the next turn inline: the second step is sent
    assert history(run.id) == ["r.a", "r.a"]
    assert len(sent_steps(durable_env)) == 1
    durable_env.run_until_idle()
    assert history(run.id) == ["r.a", "r.a", "r.b"]


def test_except_base_exception_does_not_run_on_a_suspension(durable_env):
    run = durable.start(except_base_flow)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "a"
    assert history(run.id) == ["r.a", "r.a"] and RAN == ["a", "a"]


@pytest.mark.parametrize("flow", [wf, with_flow, except_base_flow], ids=["finally", "with", "except"])
def test_with_steps_run_in_place_the_reproducer_completes_in_one_turn(durable_env, monkeypatch, flow):
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    run = durable.start(flow)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "a"
    expected = ["a", "a"] if flow is except_base_flow else ["a", "a", "b"]
    assert expected == RAN
    assert history(run.id) == [f"r.{name}" for name in expected]
    assert Checkpoint.objects.filter(run_id=run.id, enqueued_at__isnull=False).count() == 0
