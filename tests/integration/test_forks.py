"""``durable.fork``: a new run whose history before a position is a copy of another run's, so it
replays those positions and runs on from there; and ``manage.py durable fork``."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from django.core.management import CommandError, call_command

import durable
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

RAN: Counter[str] = Counter()
BROKEN = {"charge": True}


@durable.step(name="tests.forks.reserve")
def reserve(order):
    RAN["reserve"] += 1
    return f"reserved {order}"


@durable.step(name="tests.forks.charge", retry=durable.Retry(max_attempts=1))
def charge(order):
    RAN["charge"] += 1
    if BROKEN["charge"]:
        raise ValueError("the card service rejected the call (a bug since fixed)")
    return f"charged {order}"


@durable.workflow(name="tests.forks.order")
def order(ctx, number):
    reserved = ctx.step(reserve, number)
    ctx.sleep("1m")
    return [reserved, ctx.step(charge, number)]


@durable.workflow(name="tests.forks.waits")
def waits(ctx, _):
    first = ctx.step(reserve, 1)
    return [first, ctx.wait_for_signal("go")]


@pytest.fixture(autouse=True)
def _reset():
    RAN.clear()
    BROKEN["charge"] = True


def _failed_order(env) -> str:
    run = durable.start(order, 7)
    env.run_until_idle()
    env.advance_time("1m")
    with pytest.raises(durable.RunFailed):
        durable.result(run.id)
    assert RAN == {"reserve": 1, "charge": 1}
    return run.id


def test_a_failed_run_forked_at_its_failing_step_runs_on_from_there_keeping_what_came_before(durable_env):
    origin = _failed_order(durable_env)
    BROKEN["charge"] = False
    fork = durable.fork(origin, at=2)
    durable_env.run_until_idle()
    assert durable.result(fork.id) == ["reserved 7", "charged 7"]
    assert RAN == {"reserve": 1, "charge": 2}  # the reserve step and the timer were not run again
    row = Run.objects.get(id=fork.id)
    assert (row.workflow, row.version, row.forked_from_id, row.forked_at) == (order.name, "1", origin, 2)
    copied = Checkpoint.objects.filter(run_id=fork.id, seq__lt=2).order_by("seq")
    original = Checkpoint.objects.filter(run_id=origin, seq__lt=2).order_by("seq")
    fields = ("seq", "kind", "name", "status", "attempt", "output")
    assert [tuple(getattr(c, f) for f in fields) for c in copied] == [
        tuple(getattr(c, f) for f in fields) for c in original
    ]
    assert Run.objects.get(id=origin).status == "failed"  # the origin is left as it was


def test_a_fork_at_0_runs_the_whole_body_again(durable_env):
    origin = _failed_order(durable_env)
    BROKEN["charge"] = False
    fork = durable.fork(origin, at=0)
    durable_env.run_until_idle()
    durable_env.advance_time("1m")
    assert durable.result(fork.id) == ["reserved 7", "charged 7"]
    assert RAN == {"reserve": 2, "charge": 2}


def test_a_fork_of_a_running_run_at_its_settled_positions(durable_env):
    run = durable.start(waits, None)
    durable_env.run_until_idle()
    fork = durable.fork(run.id, at=1)
    durable_env.run_until_idle()
    assert RAN == {"reserve": 1}
    durable.signal(fork.id, "go", "fork's")
    durable_env.run_until_idle()
    assert durable.result(fork.id) == ["reserved 1", "fork's"]
    assert Run.objects.get(id=run.id).status == "suspended"  # still waiting for its own signal


def test_the_same_fork_id_twice_is_one_run(durable_env):
    origin = _failed_order(durable_env)
    first = durable.fork(origin, at=2, run_id="order-7-fixed")
    again = durable.fork(origin, at=2, run_id="order-7-fixed")
    assert first.id == again.id == "order-7-fixed"
    assert Checkpoint.objects.filter(run_id="order-7-fixed").count() == 2
    with pytest.raises(durable.InvalidInput, match="is taken"):
        durable.fork(origin, at=1, run_id="order-7-fixed")


@pytest.mark.parametrize(
    ("at", "said"),
    [
        (5, "has no position 5: its history holds positions 0 to 2"),
        (-1, "a whole number from 0"),
        ("2", "a whole number from 0"),
        (True, "a whole number from 0"),
    ],
)
def test_a_position_the_history_does_not_have_is_refused_before_anything_is_stored(durable_env, at, said):
    origin = _failed_order(durable_env)
    runs = Run.objects.count()
    with pytest.raises(durable.InvalidInput, match=said):
        durable.fork(origin, at=at)
    assert Run.objects.count() == runs


def test_a_position_still_pending_before_at_is_refused(durable_env):
    run = durable.start(waits, None)
    durable_env.run_until_idle()
    with pytest.raises(
        durable.InvalidInput, match="position 1 is still pending: a fork at 2 would run it again"
    ):
        durable.fork(run.id, at=2)


def test_unknown_runs_reserved_ids_and_unknown_arguments_are_refused(durable_env):
    origin = _failed_order(durable_env)
    with pytest.raises(durable.RunNotFound):
        durable.fork("no-such-run", at=0)
    with pytest.raises(durable.InvalidInput, match="prefix durable keeps"):
        durable.fork(origin, at=0, run_id="schedule:x")
    with pytest.raises(TypeError, match="unexpected keyword argument 'input'"):
        durable.fork(origin, at=0, input=3)


def test_manage_py_durable_fork_prints_the_forks_id(durable_env):
    origin = _failed_order(durable_env)
    out = io.StringIO()
    call_command("durable", "fork", origin, "--at", "2", "--run-id", "cli-fork", stdout=out)
    assert out.getvalue().strip() == "cli-fork"
    assert Run.objects.get(id="cli-fork").forked_from_id == origin
    with pytest.raises(CommandError, match="has no position 9"):
        call_command("durable", "fork", origin, "--at", "9")
