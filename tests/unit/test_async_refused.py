"""Until durable runs them (API.md §10, Async), an ``async def`` step is refused where it is
declared, saying what to write instead, rather than failing its runs at their first turn; so is an
async generator workflow, which has no output to return."""

from __future__ import annotations

import pytest

import durable
from durable.errors import InvalidInput


async def charge(order):
    return order


async def shop(ctx, order):
    yield order


@pytest.mark.parametrize(
    ("declare", "what"),
    [
        (lambda: durable.step(charge, name="tests.async_refused.charge"), "step"),
        (lambda: durable.step(name="tests.async_refused.timed", timeout="5s")(charge), "step"),
    ],
)
def test_an_async_def_step_or_workflow_is_refused_at_declaration(declare, what):
    with pytest.raises(InvalidInput, match=rf"^{what} .* is an async def.*plain def.*astart\(\)"):
        declare()


def test_an_async_generator_workflow_is_refused_at_declaration():
    with pytest.raises(InvalidInput, match=r"^workflow .* is an async generator .*async def that returns"):
        durable.workflow(name="tests.async_refused.shop")(shop)
