"""An ``async def`` workflow is refused where it is declared until async bodies run (API.md §10,
Async), saying what to write instead; an ``async def`` step is accepted, an async generator step
(no one output to record) is refused."""

from __future__ import annotations

import pytest

import durable
from durable.errors import InvalidInput


async def charge(order):
    return order


async def charges(orders):
    for order in orders:
        yield order


async def shop(ctx, order):
    return order


def test_an_async_def_workflow_is_refused_at_declaration():
    with pytest.raises(InvalidInput, match=r"^workflow .* is an async def.*plain def.*astart\(\)"):
        durable.workflow(name="tests.async_refused.shop")(shop)


def test_an_async_def_step_is_accepted():
    step = durable.step(name="tests.async_refused.timed", timeout="5s")(charge)
    assert step.name == "tests.async_refused.timed"


def test_an_async_generator_step_is_refused_at_declaration():
    with pytest.raises(InvalidInput, match=r"^step .*charges.* is an async generator.*return them as a list"):
        durable.step(name="tests.async_refused.charges")(charges)
