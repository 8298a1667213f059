"""The pure core's view of a step under a fleet-wide limit, and the limits as declared."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable.errors import InvalidInput
from durable.limits import Concurrency, Rate

from .replaykit import LIMITS, RUN, T0, turn


@durable.step(name="tests.unit_flow.limited", concurrency=2, timeout="1m")
def limited(x: int) -> int:
    return x


@durable.step(name="tests.unit_flow.rated", rate_limit="10/m")
def rated(x: int) -> int:
    return x


@durable.step(name="tests.unit_flow.plain")
def plain(x: int) -> int:
    return x


def _sent(name: str, flow: str | None, **fields):
    from durable.replay.history import Record

    return Record(
        seq=0,
        kind="step",
        name=name,
        enqueued_at=T0 - timedelta(hours=1),
        flow=flow,
        stored_as=("pending", 1),
        **fields,
    )


def test_an_attempt_in_line_for_a_slot_is_never_sent_again_by_the_run() -> None:
    rec = _sent(limited.name, "waiting")  # enqueued long past redispatch_after
    t = turn(lambda ctx, _: ctx.step(limited, 1), [rec])
    assert t.outcome.status == "suspended" and t.state.dispatch == []
    assert t.outcome.wake_at == T0 + LIMITS.reconcile_interval  # the hand-off wakes it, not a timer


def test_an_attempt_waiting_for_a_rate_token_sleeps_until_it_is_due() -> None:
    rec = _sent(rated.name, "rate", wake_at=T0 + timedelta(seconds=7))
    t = turn(lambda ctx, _: ctx.step(rated, 1), [rec])
    assert t.state.dispatch == [] and t.outcome.wake_at == T0 + timedelta(seconds=7)


def test_an_attempt_whose_rate_token_is_due_is_sent_again_out_of_the_rate_wait() -> None:
    rec = _sent(rated.name, "rate", wake_at=T0 - timedelta(milliseconds=1))
    t = turn(lambda ctx, _: ctx.step(rated, 1), [rec])
    assert t.state.dispatch == [rec]
    assert (rec.flow, rec.enqueued_at) == (None, T0)


def test_an_attempt_holding_a_slot_frees_it_when_the_turn_times_it_out() -> None:
    rec = _sent(
        limited.name, "held", flow_key="c:tests.unit_flow.limited:", started_at=T0 - timedelta(minutes=5)
    )
    t = turn(lambda ctx, _: ctx.step(limited, 1), [rec])
    assert rec.attempt == 2 and rec.flow is None
    assert t.state.freed == ["c:tests.unit_flow.limited:"]


class Anywhere:
    """Runs every step in place, and records what it ran."""

    def __init__(self) -> None:
        self.ran: list[int] = []

    def accepts(self, queue: str, step: object) -> bool:
        return True

    def holder(self, queue: str, step: object) -> None:
        return None

    def __call__(self, rec, step):
        self.ran.append(rec.seq)
        return rec.input["args"][0], None, False


def _in_place(flush):
    from durable.definitions import Workflow
    from durable.replay.core import replay
    from durable.replay.turnstate import TurnState

    state, runner = TurnState(records={}), Anywhere()
    body = Workflow(fn=lambda ctx, _: [ctx.step(limited, 1), ctx.step(limited, 2)], name=RUN.workflow)
    outcome = replay(
        body, RUN, state, clock=lambda: T0, limits=LIMITS, flush=flush, renew=lambda: None, in_place=runner
    )
    return outcome, state, runner


def test_a_limited_step_runs_in_place_once_the_write_that_starts_it_gives_it_a_slot() -> None:
    def admitted(state) -> None:  # the executor's write: each start takes its key's slot
        for rec in state.unsaved():
            if rec.status == "pending":
                rec.flow, rec.flow_key = "held", "c:tests.unit_flow.limited:"
            rec.stored_as, rec.dirty = (rec.status, rec.attempt), False

    outcome, state, runner = _in_place(admitted)
    assert outcome.status == "completed" and outcome.output == [1, 2] and runner.ran == [0, 1]
    # The first result, written with the second start, hands its slot on in that write; the
    # second's goes with the settle.
    assert state.freed == ["c:tests.unit_flow.limited:"] * 2
    assert all(rec.flow is None for rec in state.records.values())


def test_a_limited_step_the_write_made_wait_is_not_run_and_its_run_waits() -> None:
    def full(state) -> None:  # the executor's write found no free slot: sent but unstarted, in line
        for rec in state.unsaved():
            rec.started_at, rec.enqueued_at, rec.flow = None, T0, "waiting"
            rec.stored_as, rec.dirty = (rec.status, rec.attempt), False

    outcome, state, runner = _in_place(full)
    assert outcome.status == "suspended" and runner.ran == [] and state.dispatch == []
    assert outcome.wake_at == T0 + LIMITS.reconcile_interval  # the hand-off sends it, not a timer


# -- declarations ------------------------------------------------------------------------------


def test_a_concurrency_key_template_reads_arguments_by_position_or_parameter_name() -> None:
    def charge(customer, cents, *, currency="EUR"):
        return None

    assert Concurrency(1, key="{0}").key_for(charge, ["ann", 5], {}) == "ann"
    assert Concurrency(1, key="{customer}").key_for(charge, ["ann", 5], {}) == "ann"
    assert (
        Concurrency(1, key="{customer}-{currency}").key_for(charge, [], {"customer": "bo", "currency": "USD"})
        == "bo-USD"
    )
    assert (
        Concurrency(1, key=lambda customer, cents: customer.upper()).key_for(charge, ["ann", 5], {}) == "ANN"
    )
    assert Concurrency(3).key_for(charge, ["ann", 5], {}) == ""


@pytest.mark.parametrize("key", ["{missing}", "{5}", lambda *a: 3, lambda *a: ""])
def test_a_key_that_cannot_be_made_is_invalid_input(key) -> None:
    with pytest.raises(InvalidInput, match="concurrency key"):
        Concurrency(1, key=key).key_for(lambda customer: None, ["ann"], {})


@pytest.mark.parametrize("limit, key", [(0, None), (True, None), (1.5, None), (1, ""), (1, 3)])
def test_a_bad_concurrency_is_refused(limit, key) -> None:
    with pytest.raises(InvalidInput):
        Concurrency(limit, key=key)


@pytest.mark.parametrize(
    "text, count, seconds", [("100/m", 100, 60), ("5/s", 5, 1), (" 2 / h ", 2, 3600), ("1/s", 1, 1)]
)
def test_a_rate_limit_is_parsed_at_declaration(text, count, seconds) -> None:
    rate = Rate.parse(text, "rate_limit=")
    assert (rate.count, rate.period) == (count, timedelta(seconds=seconds))
    assert str(rate) == text.replace(" ", "")


@pytest.mark.parametrize("text", ["100", "100/d", "0/s", "-1/s", "1.5/s", "/s", 5, ["5/s"]])
def test_a_bad_rate_limit_is_refused_with_what_to_write(text) -> None:
    with pytest.raises(InvalidInput, match='"100/m"'):
        Rate.parse(text, "rate_limit=")
