"""A step function called directly inside a workflow body is refused; everywhere else it is a call."""

from __future__ import annotations

import contextlib

import pytest

import durable

pytestmark = pytest.mark.django_db

sent: list[int] = []


@durable.step(name="tests.calls.send_email")
def send_email(user_id):
    sent.append(user_id)
    return f"sent to {user_id}"


@durable.step(name="tests.calls.notify")
def notify(user_id):
    return send_email(user_id)  # a step body may call another step's function


@durable.step(name="tests.calls.notify_local", local=True)
def notify_local(user_id):
    return send_email(user_id)


@durable.workflow(name="tests.calls.direct")
def direct(ctx, user_id):
    return send_email(user_id)


@durable.workflow(name="tests.calls.caught")
def caught(ctx, user_id):
    with contextlib.suppress(durable.DurableError):
        send_email(user_id)
    return ctx.step(send_email, user_id)


@durable.workflow(name="tests.calls.nested")
def nested(ctx, user_id):
    return [ctx.step(notify, user_id), ctx.step(notify_local, user_id)]


@pytest.fixture(autouse=True)
def _fresh():
    sent.clear()


def test_a_step_called_directly_in_a_body_fails_the_run_naming_the_fix(durable_env):
    run = durable.start(direct, 5)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed) as failed:
        durable.result(run.id)
    assert "use ctx.step(send_email, ...)" in failed.value.message
    assert failed.value.code == "step_called_directly"
    assert sent == []


def test_the_refused_call_runs_nothing_even_when_the_body_catches_it(durable_env):
    run = durable.start(caught, 5)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "sent to 5"
    assert sent == [5]


def test_outside_a_workflow_a_step_function_is_a_plain_call():
    assert send_email(3) == "sent to 3"
    assert sent == [3]


@pytest.mark.parametrize("in_place", [False, True], ids=["dispatched", "in place"])
def test_a_step_body_may_call_another_steps_function(durable_env, monkeypatch, in_place):
    if in_place:
        monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    run = durable.start(nested, 9)
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["sent to 9", "sent to 9"]
    assert sent == [9, 9]
