"""A step attempt ends with the same error code wherever it ran: a local step inside the turn, a
dispatched step run in place by a worker of its queue, or a dispatched step sent as a message."""

from __future__ import annotations

import pytest

import durable
from durable import dispatch
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

RETRY = durable.Retry(max_attempts=3, initial="1s")
ONCE = durable.Retry(max_attempts=1)


class Opaque:
    """Not JSON."""


@durable.step(name="tests.attempt_codes.local_opaque", local=True, retry=RETRY)
def local_opaque():
    return Opaque()


@durable.step(name="tests.attempt_codes.opaque", retry=RETRY)
def opaque():
    return Opaque()


@durable.step(name="tests.attempt_codes.local_refuses", local=True, retry=RETRY)
def local_refuses():
    raise durable.InvalidInput("the step refused its own input")


@durable.step(name="tests.attempt_codes.refuses", retry=RETRY)
def refuses():
    raise durable.InvalidInput("the step refused its own input")


@durable.step(name="tests.attempt_codes.local_interrupted", local=True, retry=ONCE)
def local_interrupted():
    raise KeyboardInterrupt()


@durable.step(name="tests.attempt_codes.interrupted", retry=ONCE)
def interrupted():
    raise KeyboardInterrupt()


@durable.workflow(name="tests.attempt_codes.one_step")
def one_step(ctx, name):
    return ctx.step(name)


def _run(env, step_name):
    """Start a run of one step and drive it to its end; return the step's row and the messages."""
    run = durable.start(one_step, step_name)
    sent = []
    while env.pending():
        sent.append(env.run_next().task)
    assert durable.get_run(run.id).status == "failed"
    return Checkpoint.objects.get(run_id=run.id, seq=0), sent


@pytest.fixture
def local(durable_env):
    return lambda kind: _run(durable_env, f"tests.attempt_codes.local_{kind}")


@pytest.fixture
def in_place(durable_env, monkeypatch):
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})  # a worker of the step's queue

    def run(kind):
        row, sent = _run(durable_env, f"tests.attempt_codes.{kind}")
        assert dispatch.RUN_STEP not in sent  # it ran inside the turn
        return row, sent

    return run


@pytest.fixture
def dispatched(durable_env):
    def run(kind):
        row, sent = _run(durable_env, f"tests.attempt_codes.{kind}")
        assert dispatch.RUN_STEP in sent  # it crossed the broker
        return row, sent

    return run


@pytest.mark.parametrize("where", ["local", "in_place", "dispatched"])
def test_a_non_json_step_result_is_invalid_output_and_not_retried(where, request):
    row, _ = request.getfixturevalue(where)("opaque")
    assert (row.status, row.attempt, row.error["type"], row.error["code"]) == (
        "failed",
        1,
        "InvalidInput",
        "invalid_output",
    )
    assert "the output of step" in row.error["message"]


@pytest.mark.parametrize("where", ["local", "in_place", "dispatched"])
def test_invalid_input_raised_by_a_step_keeps_its_code_and_is_not_retried(where, request):
    row, _ = request.getfixturevalue(where)("refuses")
    assert (row.status, row.attempt, row.error["code"]) == ("failed", 1, "invalid_input")
    assert row.error["message"] == "the step refused its own input"


@pytest.mark.parametrize("where", ["local", "in_place", "dispatched"])
def test_a_keyboard_interrupt_in_a_step_is_a_failed_attempt_of_its_type(where, request):
    row, _ = request.getfixturevalue(where)("interrupted")
    assert (row.status, row.error["type"]) == ("failed", "KeyboardInterrupt")
