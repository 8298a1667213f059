"""Limited steps on the path users take: a step whose ``concurrency`` or ``rate_limit`` (its own or
its lane's) is not reached runs in place, inside the turn that awaits it, its slot and rate token
taken in the write that starts it; one that finds its limit reached waits, sent but unstarted, as a
worker's take would have left it.

The harness sends every step as a message; these tests make it a worker of the "durable" queue.
"""

from __future__ import annotations

import pytest

import durable
from durable import dispatch
from durable.engine import turn
from durable.errors import _ControlFlow
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

STARTED: list[str] = []
TOKENS: dict[str, str] = {}
#: The slots of the step's key held while each attempt ran, counted from inside it.
SEEN_HELD: list[int] = []
ONE_AT_A_TIME = durable.Lane("tests.limits_in_place.one_at_a_time", concurrency=1)


class WorkerDied(_ControlFlow):
    """Stands for the process dying mid-step: nothing after it runs, the lease stays held."""


@pytest.fixture
def env(durable_env, monkeypatch):
    """The harness, as a worker that consumes the "durable" queue."""
    STARTED.clear()
    TOKENS.clear()
    SEEN_HELD.clear()
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    return durable_env


def _held(key_prefix: str) -> int:
    return Checkpoint.objects.filter(flow="held", status="pending", flow_key__startswith=key_prefix).count()


@durable.step(name="tests.limits_in_place.counted", concurrency=1)
def counted(name):
    STARTED.append(name)
    SEEN_HELD.append(_held("c:tests.limits_in_place.counted:"))
    return name


@durable.step(name="tests.limits_in_place.later", concurrency=1)
def later(name):
    """In flight until completed from outside: it keeps its slot, as a step still running would."""
    STARTED.append(name)
    TOKENS[name] = durable.step_info().token
    raise durable.CompleteLater()


@durable.step(name="tests.limits_in_place.rated", rate_limit="1/m")
def rated(name):
    STARTED.append(name)
    return name


@durable.step(name="tests.limits_in_place.dies_once", concurrency=1, retry=durable.Retry(initial="1s"))
def dies_once(name):
    STARTED.append(name)
    SEEN_HELD.append(_held("c:tests.limits_in_place.dies_once:"))
    if STARTED.count(name) == 1 and name == "a":
        raise WorkerDied()
    return name


@durable.step(name="tests.limits_in_place.lane_a", lane=ONE_AT_A_TIME)
def lane_a(name):
    STARTED.append(name)
    TOKENS[name] = durable.step_info().token
    raise durable.CompleteLater()


@durable.step(name="tests.limits_in_place.lane_b", lane=ONE_AT_A_TIME)
def lane_b(name):
    STARTED.append(name)
    SEEN_HELD.append(_held("c:lane:tests.limits_in_place.one_at_a_time:"))
    return name


@durable.step(name="tests.limits_in_place.queued_behind", concurrency=1)
def queued_behind(name):
    """Its first attempt starts another run whose attempt of this step then waits in line for
    the one slot, before this one returns."""
    STARTED.append(name)
    SEEN_HELD.append(_held("c:tests.limits_in_place.queued_behind:"))
    if name == "a1":
        waiter = durable.start(one_queued, "b")
        TOKENS["waiter"] = waiter.id
        turn.advance(waiter.id)
        assert _row(waiter.id).flow == "waiting"
    return name


@durable.step(name="tests.limits_in_place.badkey", concurrency=durable.Concurrency(limit=1, key="{nope}"))
def badkey(x):
    STARTED.append(x)
    return x


@durable.workflow(name="tests.limits_in_place.three")
def three(ctx, _):
    return [ctx.step(counted, "a"), ctx.step(counted, "b"), ctx.step(counted, "c")]


@durable.workflow(name="tests.limits_in_place.one_later")
def one_later(ctx, name):
    return ctx.step(later, name)


@durable.workflow(name="tests.limits_in_place.one_rated")
def one_rated(ctx, name):
    return ctx.step(rated, name)


@durable.workflow(name="tests.limits_in_place.one_dying")
def one_dying(ctx, name):
    return ctx.step(dies_once, name)


@durable.workflow(name="tests.limits_in_place.in_lane_a")
def in_lane_a(ctx, name):
    return ctx.step(lane_a, name)


@durable.workflow(name="tests.limits_in_place.in_lane_b")
def in_lane_b(ctx, name):
    return ctx.step(lane_b, name)


@durable.workflow(name="tests.limits_in_place.two_queued")
def two_queued(ctx, _):
    return [ctx.step(queued_behind, "a1"), ctx.step(queued_behind, "a2")]


@durable.workflow(name="tests.limits_in_place.one_queued")
def one_queued(ctx, name):
    return ctx.step(queued_behind, name)


@durable.workflow(name="tests.limits_in_place.bad")
def bad(ctx, x):
    return ctx.step(badkey, x)


def _row(run_id, seq=0):
    return Checkpoint.objects.get(run_id=run_id, seq=seq)


def test_a_limited_step_in_sequence_runs_in_place_holding_its_slot_while_it_runs(env):
    run = durable.start(three)
    env.run_next()
    assert durable.result(run.id) == ["a", "b", "c"]
    assert env.pending() == []  # no step message, no hand-off
    assert STARTED == ["a", "b", "c"]
    assert SEEN_HELD == [1, 1, 1]  # each held the one slot while it ran, and gave it back after
    for row in Checkpoint.objects.filter(run_id=run.id):
        assert row.enqueued_at is None and row.started_at is not None  # started here, never sent
        assert (row.status, row.flow, row.flow_key) == ("completed", None, "c:tests.limits_in_place.counted:")
    assert _held("c:tests.limits_in_place.counted:") == 0


def test_a_limited_step_whose_slot_is_taken_waits_in_line_and_the_freed_slot_sends_it(env):
    first = durable.start(one_later, "first")
    env.run_next()
    assert STARTED == ["first"] and _row(first.id).flow == "held"
    second = durable.start(one_later, "second")
    env.run_next()
    assert STARTED == ["first"]  # found the slot taken in the write that would have started it
    waiting = _row(second.id)
    assert (waiting.flow, waiting.started_at) == ("waiting", None) and waiting.enqueued_at is not None
    assert env.pending() == [] and durable.get_run(second.id).status == "suspended"
    durable.complete_step(TOKENS.pop("first"), "first done")
    assert dispatch.RUN_STEP in [m.task for m in env.pending()]  # handed on at once, by the result
    env.run_until_idle()
    assert STARTED == ["first", "second"] and durable.result(first.id) == "first done"
    durable.complete_step(TOKENS.pop("second"), "second done")
    env.run_until_idle()
    assert durable.result(second.id) == "second done"


def test_a_slot_freed_in_sequence_goes_to_the_attempt_in_line_not_to_the_runs_next_step(env):
    """The next step of a run keeps the slot its step before freed only when nobody waits for it:
    an attempt of another run in line gets it, and the next step waits behind that one."""
    run = durable.start(two_queued)
    env.run_next()
    assert (_row(run.id, 1).flow, _row(run.id, 1).started_at) == ("waiting", None)
    env.run_until_idle()
    assert STARTED == ["a1", "b", "a2"] and SEEN_HELD == [1, 1, 1]
    assert durable.result(run.id) == ["a1", "a2"]
    assert durable.result(TOKENS["waiter"]) == "b"


def test_a_rate_limited_step_over_its_rate_waits_for_its_token_on_the_runs_timer(env):
    first = durable.start(one_rated, "first")
    env.run_next()
    assert durable.result(first.id) == "first"
    second = durable.start(one_rated, "second")
    env.run_next()
    row = _row(second.id)
    assert STARTED == ["first"] and (row.flow, row.started_at) == ("rate", None)
    assert durable.get_run(second.id).wake_at == row.wake_at  # its run's timer brings it back
    env.advance_time("59s")
    assert STARTED == ["first"]
    env.advance_time("2s")
    assert durable.result(second.id) == "second" and STARTED == ["first", "second"]


def test_a_lane_holds_steps_of_two_workflows_run_in_place_to_its_one_slot(env):
    a = durable.start(in_lane_a, "a")
    env.run_next()
    b = durable.start(in_lane_b, "b")
    env.run_next()
    assert STARTED == ["a"] and _row(b.id).flow == "waiting"
    durable.complete_step(TOKENS.pop("a"), "a done")
    env.run_until_idle()
    assert STARTED == ["a", "b"] and SEEN_HELD == [1]
    assert [durable.result(a.id), durable.result(b.id)] == ["a done", "b"]


def test_a_turn_that_dies_in_a_limited_step_gives_its_slot_back_once_the_attempt_counts_lost(env):
    a = durable.start(one_dying, "a")
    with pytest.raises(WorkerDied):
        turn.advance(a.id)
    b = durable.start(one_dying, "b")
    env.run_until_idle()  # a's message finds its run leased to the dead turn
    assert STARTED == ["a"] and _row(b.id).flow == "waiting"  # a's dead attempt still holds it
    env.advance_time("31s")  # past a's lease: its next turn counts the attempt lost, frees the slot
    env.advance_time("2s")  # a's retry, after its backoff
    assert [durable.result(a.id), durable.result(b.id)] == ["a", "b"]
    assert sorted(STARTED) == ["a", "a", "b"]
    assert SEEN_HELD == [1, 1, 1]  # never two at once


def test_a_limited_step_whose_key_cannot_be_made_is_sent_and_fails_without_running(env):
    run = durable.start(bad, 1)
    env.run_until_idle()
    run = durable.get_run(run.id)
    assert run.status == "failed" and "concurrency key" in run.error["message"]
    assert STARTED == []
