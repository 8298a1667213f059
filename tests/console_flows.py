"""Workflows the admin console's tests drive, shared by the client tests and the browser tests."""

from __future__ import annotations

from typing import Any

import durable
from durable import Retry

#: Flipped by a test: while True, ``console_charge`` fails for good.
OUTAGE = {"on": False}
#: What the saga's compensations undid, in order.
UNDONE: list[str] = []


@durable.step(name="tests.console_square")
def square(n: int) -> int:
    return n * n


@durable.step(name="tests.console_charge", retry=Retry(max_attempts=1))
def charge(cents: int) -> str:
    if OUTAGE["on"]:
        raise ConnectionError("payment provider is down")
    return f"charged {cents}"


@durable.step(name="tests.console_reserve")
def reserve(item: str) -> str:
    return f"reservation-{item}"


@reserve.compensation
def release(reservation: str, item: str) -> None:
    UNDONE.append(reservation)


@durable.workflow(name="tests.console_fan")
def fan_flow(ctx: durable.Context, n: int) -> int:
    return sum(ctx.map(square, range(n)))


@durable.workflow(name="tests.console_charge_flow")
def charge_flow(ctx: durable.Context, cents: int) -> str:
    return ctx.step(charge, cents)


@durable.workflow(name="tests.console_approval")
def approval_flow(ctx: durable.Context, order: Any) -> Any:
    decision = ctx.wait_for_signal("approve")
    return {"order": order, "approved_by": decision["by"]}


@approval_flow.validator("approve")
def approval_is_signed(payload: Any) -> None:
    if not isinstance(payload, dict) or not payload.get("by"):
        raise ValueError('an approval names who approved it: {"by": "<name>"}')


@durable.workflow(name="tests.console_saga")
def saga_flow(ctx: durable.Context, item: str) -> str:
    ctx.step(reserve, item)
    return ctx.wait_for_signal("shipped")


@durable.workflow(name="tests.console_failure_handler")
def failure_handler(ctx: durable.Context, failure: Any) -> str:
    return "noted"


@durable.workflow(name="tests.console_routed", on_error={"*": failure_handler})
def routed_flow(ctx: durable.Context, cents: int) -> str:
    return ctx.step(charge, cents)


@durable.step(name="tests.console_charge_twice", retry=Retry(max_attempts=2, initial="1s"))
def charge_twice(cents: int) -> str:
    if OUTAGE["on"]:
        raise ConnectionError("payment provider is down")
    return f"charged {cents}"


@durable.workflow(name="tests.console_charge_twice_flow")
def charge_twice_flow(ctx: durable.Context, cents: int) -> str:
    return ctx.step(charge_twice, cents)


@durable.workflow(name="tests.console_deadline")
def deadline_flow(ctx: durable.Context, order: Any) -> Any:
    return ctx.wait_for_signal("approve", timeout="1h")


#: A lane of one slot that two workflows' steps share (the health page's "Lanes").
RENDERING = durable.Lane("tests.console_rendering", concurrency=1)


@durable.step(name="tests.console_render", lane=RENDERING)
def render(page: int) -> str:
    raise durable.CompleteLater()  # holds the lane's slot until completed from outside


@durable.workflow(name="tests.console_render_flow")
def render_flow(ctx: durable.Context, page: int) -> str:
    return ctx.step(render, page)
