"""Which waits send a countdown hint (``dispatch.advance_at``): a timer that ends a wait of the
body and falls due within ``TIMER_HINT_WITHIN``, never a step attempt's deadline (a check that
normally never fires: one more message per step for nothing)."""

from __future__ import annotations

import pytest
from django.test import override_settings

import durable
from durable.dispatch import ADVANCE

pytestmark = pytest.mark.django_db(transaction=True)


@durable.step(name="tests.timer_hints.bounded", timeout="30s")
def bounded(i):
    return i


@durable.workflow(name="tests.timer_hints.step")
def step_flow(ctx, _):
    return ctx.step(bounded, 1)


@durable.workflow(name="tests.timer_hints.nap")
def nap_flow(ctx, seconds):
    ctx.sleep(seconds)
    return "rested"


def held(durable_env) -> list[str]:
    durable_env.pending()
    return [message.task for _, message in durable_env.later]


def test_a_step_with_a_timeout_sends_no_hint(durable_env):
    durable.start(step_flow)
    durable_env.run_next()
    assert held(durable_env) == []


def test_a_short_sleep_sends_one_held_until_due_and_a_long_one_none(durable_env):
    short = durable.start(nap_flow, "2s")
    durable.start(nap_flow, "2h")
    durable_env.run_until_idle()
    assert held(durable_env) == [ADVANCE]
    durable_env.advance_time("1s")
    assert durable.get_run(short.id).status == "suspended"  # the countdown is still held
    durable_env.advance_time("2s")
    assert durable.result(short.id) == "rested"


@override_settings(DURABLE={"TIMER_HINT_WITHIN": "0s"})
def test_timer_hints_can_be_turned_off(durable_env):
    durable.start(nap_flow, "2s")
    durable_env.run_until_idle()
    assert held(durable_env) == []
