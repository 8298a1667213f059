"""Fleet-wide step limits: ``concurrency`` slots handed on however an attempt ends, oldest waiter
first, and ``rate_limit`` tokens waited for on a durable timer.

An attempt in flight here is one that raised CompleteLater (held until ``complete_step``) or one
whose process "died" holding it: both keep their slot, as a step still running would.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable import dispatch
from durable.engine import steps
from durable.errors import InvalidInput, _ControlFlow
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

STARTED: list[str] = []
TOKENS: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _clear():
    STARTED.clear()
    TOKENS.clear()


class ProcessDied(_ControlFlow):
    """Stands for the worker process dying mid-step: nothing records the attempt."""


@durable.step(name="tests.flow.held", concurrency=2, retry=durable.Retry(max_attempts=2, initial="1s"))
def held(name):
    """In flight until completed from outside; some names end otherwise, as the test needs."""
    STARTED.append(name)
    if name.startswith("die"):
        raise ProcessDied()
    if name.startswith("fail"):
        raise durable.ApplicationError("refused", non_retryable=True)
    if name.startswith("flaky") and durable.step_info().attempt == 1:
        raise ValueError("try again")
    TOKENS[name] = durable.step_info().token
    raise durable.CompleteLater()


@durable.step(name="tests.flow.per_customer", concurrency=durable.Concurrency(limit=1, key="{customer}"))
def per_customer(customer, amount):
    STARTED.append(f"{customer}:{amount}")
    TOKENS[f"{customer}:{amount}"] = durable.step_info().token
    raise durable.CompleteLater()


@durable.step(name="tests.flow.slow", concurrency=1, heartbeat_timeout="10s")
def silent(name):
    STARTED.append(name)
    TOKENS[name] = durable.step_info().token
    raise durable.CompleteLater()


@durable.step(name="tests.flow.rated", rate_limit="2/s")
def rated(name):
    STARTED.append(name)
    return name


@durable.step(name="tests.flow.both", concurrency=1, rate_limit="1/s")
def both(name):
    STARTED.append(name)
    TOKENS[name] = durable.step_info().token
    raise durable.CompleteLater()


@durable.workflow(name="tests.flow.both_fan")
def both_fan(ctx, names):
    return ctx.map(both, names)


@durable.workflow(name="tests.flow.fan")
def fan(ctx, names):
    return ctx.map(held, names)


@durable.workflow(name="tests.flow.settled")
def settled(ctx, names):
    return [o.ok for o in ctx.all_settled([ctx.defer(held, name) for name in names])]


@durable.workflow(name="tests.flow.one")
def one(ctx, name):
    return ctx.step(held, name)


@durable.workflow(name="tests.flow.customers")
def customers(ctx, pairs):
    return ctx.all([ctx.defer(per_customer, c, a) for c, a in pairs])


@durable.workflow(name="tests.flow.silent")
def silent_fan(ctx, names):
    return ctx.map(silent, names)


@durable.workflow(name="tests.flow.rated_fan")
def rated_fan(ctx, names):
    return ctx.map(rated, names)


def _flows(run_id):
    return {r.input["args"][0]: r.flow for r in Checkpoint.objects.filter(run_id=run_id, kind="step")}


def _finish(name, output=None):
    durable.complete_step(TOKENS.pop(name), output if output is not None else name)


# -- concurrency -----------------------------------------------------------------------------


def test_a_fan_never_has_more_attempts_in_flight_than_its_limit(durable_env):
    run = durable.start(fan, ["a", "b", "c", "d", "e"])
    durable_env.run_until_idle()
    assert STARTED == ["a", "b"]
    assert _flows(run.id) == {"a": "held", "b": "held", "c": "waiting", "d": "waiting", "e": "waiting"}
    for name in ["a", "b", "c", "d", "e"]:
        _finish(name)
        durable_env.run_until_idle()
        assert len(TOKENS) <= 2
    assert STARTED == ["a", "b", "c", "d", "e"]
    assert durable.result(run.id) == ["a", "b", "c", "d", "e"]


def test_the_oldest_waiter_gets_the_freed_slot_first(durable_env):
    first = durable.start(fan, ["a", "b"])
    durable_env.run_until_idle()
    second = durable.start(one, "older")
    durable_env.run_until_idle()
    third = durable.start(one, "younger")
    durable_env.run_until_idle()
    assert STARTED == ["a", "b"]
    _finish("b")
    durable_env.run_until_idle()
    assert STARTED == ["a", "b", "older"]  # handed on by the attempt that ended, no sweep needed
    _finish("a")
    durable_env.run_until_idle()
    assert STARTED == ["a", "b", "older", "younger"]
    _finish("older")
    _finish("younger")
    durable_env.run_until_idle()
    assert [durable.get_run(r.id).status for r in (first, second, third)] == ["completed"] * 3


def test_a_failed_attempt_frees_its_slot(durable_env):
    run = durable.start(settled, ["fail-1", "a", "b"])
    durable_env.run_until_idle()
    assert STARTED == ["fail-1", "a", "b"]  # fail-1 ended at once and handed its slot to b
    _finish("a")
    _finish("b")
    durable_env.run_until_idle()
    assert durable.result(run.id) == [False, True, True]


def test_an_attempt_that_will_be_retried_gives_up_its_slot_during_its_backoff(durable_env):
    durable.start(fan, ["flaky", "a", "b"])
    durable_env.run_until_idle()
    assert STARTED == ["flaky", "a", "b"]  # flaky's failure handed its slot to b
    durable_env.advance_time("2s")  # flaky's retry is sent, and waits in line
    assert STARTED == ["flaky", "a", "b"]
    _finish("a")
    durable_env.run_until_idle()
    assert STARTED == ["flaky", "a", "b", "flaky"]


def test_an_attempt_whose_worker_died_frees_its_slot_within_a_lease(durable_env):
    with pytest.raises(ProcessDied):
        durable.start(fan, ["die", "a", "b"]) and durable_env.run_until_idle()
    durable_env.run_until_idle()
    assert STARTED == ["die", "a"]
    durable_env.advance_time("29s")
    assert STARTED == ["die", "a"]  # its hold still counts
    durable_env.advance_time("2s")  # the hold lapsed: the slot is handed on
    assert STARTED[:3] == ["die", "a", "b"]


def test_an_attempt_that_timed_out_frees_its_slot(durable_env):
    run = durable.start(silent_fan, ["a", "b"])
    durable_env.run_until_idle()
    assert STARTED == ["a"] and _flows(run.id)["b"] == "waiting"
    # No heartbeat within heartbeat_timeout (and the persist throttle): the turn fails a's
    # attempt and hands its slot to b; a's retry waits in line behind b.
    durable_env.advance_time("25s")
    assert STARTED == ["a", "b"]
    assert _flows(run.id) == {"a": None, "b": "held"}  # a waits out its retry's backoff
    durable_env.advance_time("3s")
    assert _flows(run.id) == {"a": "waiting", "b": "held"}
    assert STARTED == ["a", "b"]


def test_a_cancelled_run_frees_its_slots(durable_env):
    first = durable.start(fan, ["a", "b"])
    durable_env.run_until_idle()
    waiting = durable.start(one, "next")
    durable_env.run_until_idle()
    assert STARTED == ["a", "b"]
    durable.cancel(first.id)
    durable_env.run_until_idle()
    assert STARTED == ["a", "b", "next"]
    _finish("next")
    durable_env.run_until_idle()
    assert durable.result(waiting.id) == "next"


def test_a_keyed_limit_holds_each_key_apart(durable_env):
    run = durable.start(customers, [["ann", 1], ["bob", 1], ["ann", 2], ["bob", 2]])
    durable_env.run_until_idle()
    assert STARTED == ["ann:1", "bob:1"]
    _finish("ann:1")
    durable_env.run_until_idle()
    assert STARTED == ["ann:1", "bob:1", "ann:2"]
    for name in ["bob:1", "ann:2", "bob:2"]:
        _finish(name)
        durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "completed"


def test_a_lost_hand_off_message_is_sent_again_by_its_run(durable_env):
    durable.start(fan, ["a", "b", "c"])
    durable_env.run_until_idle()
    _finish("a")
    durable_env.drop(dispatch.RUN_STEP)  # the hand-off's message is lost
    assert STARTED == ["a", "b"]
    durable_env.sweep()
    assert STARTED == ["a", "b"]  # still in flight as far as the database knows: admitted
    durable_env.advance_time("5m")  # the run sends its admitted attempt again
    assert STARTED == ["a", "b", "c"]


def test_the_timer_sweep_admits_waiters_when_slots_free_up_without_a_hand_off(durable_env, monkeypatch):
    durable.start(fan, ["a", "b", "c", "d"])
    durable_env.run_until_idle()
    assert STARTED == ["a", "b"]
    monkeypatch.setattr(held, "concurrency", durable.Concurrency(limit=3))  # a deploy raised it
    durable_env.sweep()
    assert STARTED == ["a", "b", "c"]  # the oldest waiter, and only as many as the limit allows


def test_a_waiting_attempts_old_message_does_not_start_it(durable_env):
    durable.start(fan, ["a", "b", "c"])
    durable_env.run_next()  # the turn sends three attempts
    messages = [m for m in durable_env.pending() if m.task == dispatch.RUN_STEP]
    durable_env.run_until_idle()
    assert STARTED == ["a", "b"]
    assert steps.run_step(*messages[2].args) == "stale"  # redelivered while it waits in line
    assert STARTED == ["a", "b"]


# -- rate limits -------------------------------------------------------------------------------


def test_a_rate_limit_waits_on_a_durable_timer_and_never_bursts_past_it(durable_env):
    run = durable.start(rated_fan, ["a", "b", "c", "d", "e"])
    durable_env.run_until_idle()
    assert STARTED == ["a", "b"]
    rows = Checkpoint.objects.filter(run_id=run.id, flow="rate")
    assert sorted(r.wake_at - durable_env.now() for r in rows) == [
        timedelta(seconds=1.1),  # a second, and RATE_SLACK for the lag before a body starts
        timedelta(seconds=1.1),
        timedelta(seconds=2.2),  # spread over the tokens ahead, so they do not all come back at once
    ]
    durable_env.advance_time("1s")
    assert STARTED == ["a", "b"]  # a token counts for its whole period
    durable_env.advance_time("100ms")
    assert STARTED == ["a", "b", "c", "d"]
    durable_env.advance_time("1100ms")
    assert STARTED == ["a", "b", "c", "d", "e"]
    assert durable.result(run.id) == ["a", "b", "c", "d", "e"]


def test_a_step_with_both_limits_keeps_to_each(durable_env):
    run = durable.start(both_fan, ["a", "b", "c"])
    durable_env.run_until_idle()
    assert STARTED == ["a"]
    _finish("a")
    durable_env.run_until_idle()
    assert STARTED == ["a"]  # b got a's slot but no token: it gave the slot on and waits for one
    durable_env.advance_time("1100ms")
    assert len(STARTED) == 2
    _finish(STARTED[-1])
    durable_env.advance_time("1100ms")
    assert len(STARTED) == 3
    _finish(STARTED[-1])
    durable_env.run_until_idle()
    assert sorted(STARTED) == ["a", "b", "c"] and durable.get_run(run.id).status == "completed"


# -- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, says",
    [
        ({"concurrency": 0}, "at least 1"),
        ({"concurrency": "2"}, "whole number"),
        ({"concurrency": durable.Concurrency(limit=1), "local": True}, "local=True"),
        ({"rate_limit": "5/s", "local": True}, "local=True"),
        ({"rate_limit": "5 per second"}, "100/m"),
        ({"rate_limit": "0/s"}, "at least 1"),
        ({"rate_limit": 5}, "100/m"),
    ],
)
def test_bad_limits_are_refused_at_declaration(options, says):
    with pytest.raises(InvalidInput, match=says):
        durable.step(name="tests.flow.bad", **options)(lambda: None)


def test_a_key_that_cannot_be_made_fails_the_step_without_retrying(durable_env):
    @durable.step(name="tests.flow.badkey", concurrency=durable.Concurrency(limit=1, key="{nope}"))
    def badkey(x):
        return x

    @durable.workflow(name="tests.flow.badkey_flow")
    def flow(ctx, x):
        return ctx.step(badkey, x)

    run = durable.start(flow, 1)
    durable_env.run_until_idle()
    run = durable.get_run(run.id)
    assert run.status == "failed" and "concurrency key" in run.error["message"]
