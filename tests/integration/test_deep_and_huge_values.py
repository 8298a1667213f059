"""Values nested thousands deep or integers thousands of digits long, given to any public call:
``InvalidInput`` saying what to fix, before anything is stored, never a RecursionError or a
ValueError from the guard itself (which once showed the value with ``repr()``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import durable
from durable.models import CronSchedule, EntityOp, Event, Run, Signal

pytestmark = pytest.mark.django_db


def _deep(levels: int = 5000) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


DEEP = _deep()
HUGE = 10**5000
BAD = {"deep": DEEP, "huge": HUGE, "deep_in_dict": {"k": DEEP}, "huge_in_list": [1, HUGE]}


@durable.workflow(name="tests.deep_flow")
def deep_flow(ctx, _):
    return ctx.wait_for_signal("go")


@durable.workflow(name="tests.deep_flow_attrs", search_attributes_schema={"customer": str, "total": int})
def deep_flow_attrs(ctx, _):
    return None


@durable.entity("tests.deep_counter")
class DeepCounter:
    def initial_state(self):
        return 0

    def add(self, state, n):
        return state


def _run() -> str:
    return durable.start(deep_flow, run_id="deep-target").id


CALLS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "start input": (lambda v: durable.start(deep_flow, v), "input"),
    "start tags": (lambda v: durable.start(deep_flow, tags=[v]), "tags"),
    "start search attributes": (
        lambda v: durable.start(deep_flow_attrs, search_attributes={"customer": "c", "total": v}),
        "search attributes",
    ),
    "start search attributes, whole": (
        lambda v: durable.start(deep_flow_attrs, search_attributes=v),
        "search attributes",
    ),
    "cancel reason": (lambda v: durable.cancel(_run(), reason=v), "reason"),
    "signal payload": (lambda v: durable.signal(_run(), "go", v), "payload"),
    "signal_with_start input": (
        lambda v: durable.signal_with_start(deep_flow, v, run_id="deep-sws", signal="go"),
        "input",
    ),
    "signal_with_start payload": (
        lambda v: durable.signal_with_start(deep_flow, 1, run_id="deep-sws", signal="go", payload=v),
        "payload",
    ),
    "update payload": (lambda v: durable.update(_run(), "go", v), "payload"),
    "publish_event payload": (lambda v: durable.publish_event("deep-event", v), "payload"),
    "signal_entity arg": (lambda v: durable.signal_entity("tests.deep_counter", "k", "add", v), "arg"),
    "schedule input": (lambda v: durable.schedule("deep", deep_flow, cron="* * * * *", input=v), "input"),
}


def _stored() -> dict[str, int]:
    """What the calls above could have stored, besides the target run they may start first."""
    return {
        "runs": Run.objects.exclude(id="deep-target").count(),
        "signals": Signal.objects.count(),
        "events": Event.objects.count(),
        "ops": EntityOp.objects.count(),
        "schedules": CronSchedule.objects.count(),
    }


@pytest.mark.parametrize("value", list(BAD), ids=list(BAD))
@pytest.mark.parametrize("call", list(CALLS), ids=list(CALLS))
def test_a_deep_or_huge_value_is_refused_clearly_and_stores_nothing(durable_env, call, value):
    invoke = CALLS[call][0]
    before = _stored()
    with pytest.raises(durable.InvalidInput) as refused:
        invoke(BAD[value])
    message = str(refused.value)
    field = CALLS[call][1]
    assert field in message and len(message) < 500, message
    assert _stored() == before
