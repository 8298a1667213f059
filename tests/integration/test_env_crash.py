"""``durable_env.crash()`` and ``recover()``: a project's own test kills the process at a step
attempt and checks how its workflow recovers, without durable's private classes."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

CHARGED: list[tuple[str, int]] = []


@pytest.fixture(autouse=True)
def _clear():
    CHARGED.clear()


@durable.step(name="tests.env_crash.charge")
def charge(order: str) -> str:
    CHARGED.append((order, durable.step_info().attempt))
    return f"charged {order}"


@durable.step(name="tests.env_crash.note", local=True)
def note(order: str) -> str:
    CHARGED.append((order, durable.step_info().attempt))
    return f"noted {order}"


@durable.workflow(name="tests.env_crash.checkout")
def checkout(ctx, order):
    return [ctx.step(charge, order), ctx.step(note, order)]


def test_a_process_that_dies_as_a_dispatched_attempt_starts_retries_it_once_its_hold_lapses(durable_env):
    run = durable.start(checkout, "o-1")
    with durable_env.crash(charge, when="before") as crash:
        durable_env.run_until_idle()
    assert crash.at == (run.id, 0)
    assert CHARGED == [] and durable.get_run(run.id).status != "completed"
    durable_env.recover()
    durable_env.advance_time("1m")  # the lost attempt's retry waits out its backoff
    assert durable.result(run.id) == ["charged o-1", "noted o-1"]
    # The dead process's attempt counts as lost: the body ran once, as attempt 2.
    assert CHARGED == [("o-1", 2), ("o-1", 1)]
    assert Checkpoint.objects.get(run_id=run.id, seq=0).attempt == 2


def test_a_process_that_dies_after_the_body_ran_runs_it_again_the_step_at_least_once(durable_env):
    run = durable.start(checkout, "o-2")
    with durable_env.crash("tests.env_crash.charge", when="after"):
        durable_env.run_until_idle()
    assert CHARGED == [("o-2", 1)]  # its effect happened, its result was never recorded
    assert Checkpoint.objects.get(run_id=run.id, seq=0).status == "pending"
    durable_env.recover()
    durable_env.advance_time("1m")
    assert durable.result(run.id) == ["charged o-2", "noted o-2"]
    assert CHARGED == [("o-2", 1), ("o-2", 2), ("o-2", 1)]


def test_a_turn_that_dies_in_a_local_step_is_taken_up_once_its_lease_lapses(durable_env):
    run = durable.start(checkout, "o-3")
    with durable_env.crash(note, when="after"):
        durable_env.run_until_idle()
    assert durable.get_run(run.id).locked_by is not None  # the dead turn's lease, still held
    durable_env.recover()
    assert durable.result(run.id) == ["charged o-3", "noted o-3"]
    # A local step is not held: killed after its body, it runs again as the same attempt.
    assert CHARGED == [("o-3", 1), ("o-3", 1), ("o-3", 1)]


def test_a_crash_that_never_came_says_so(durable_env):
    durable.start(checkout, "o-4")
    with (
        pytest.raises(durable.DurableError, match="did not run inside the block"),
        durable_env.crash(charge, attempt=2),
    ):
        durable_env.run_until_idle()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [({"when": "during"}, "takes one of"), ({"attempt": 0}, "an attempt number from 1")],
)
def test_bad_arguments_are_refused_before_anything_runs(durable_env, kwargs, says):
    with pytest.raises(durable.InvalidInput, match=says), durable_env.crash(charge, **kwargs):
        pass
