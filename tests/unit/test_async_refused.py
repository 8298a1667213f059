"""``async def`` steps and workflows are declared like plain ones (API.md §10, Async); an async
generator, which has no one output to record, is refused where it is declared, saying what to
write instead."""

from __future__ import annotations

import pytest

import durable
from durable.errors import InvalidInput


async def charge(order):
    return order


async def charges(orders):
    for order in orders:
        yield order


async def quote(ctx, order):
    return order


async def shop(ctx, order):
    yield order


def test_an_async_def_step_is_accepted():
    step = durable.step(name="tests.async_refused.timed", timeout="5s")(charge)
    assert step.name == "tests.async_refused.timed"


def test_an_async_def_workflow_is_accepted():
    assert durable.workflow(name="tests.async_refused.quote")(quote).name == "tests.async_refused.quote"


def test_an_async_generator_step_is_refused_at_declaration():
    with pytest.raises(InvalidInput, match=r"^step .*charges.* is an async generator.*return them as a list"):
        durable.step(name="tests.async_refused.charges")(charges)


def test_an_async_generator_workflow_is_refused_at_declaration():
    with pytest.raises(InvalidInput, match=r"^workflow .* is an async generator .*async def that returns"):
        durable.workflow(name="tests.async_refused.shop")(shop)
