"""Temporal's hello samples that matter most for async, written as ``async def`` bodies:
hello_activity, hello_parallel_activity, hello_signal, hello_child_workflow, hello_cancellation
(temporalio/samples-python). The e2e suite runs some of them on a real worker."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

import durable

pytestmark = pytest.mark.django_db

CLEANED: list[str] = []


@dataclass
class ComposeGreetingInput:
    greeting: str
    name: str


@durable.step(name="tests.hello_async.compose_greeting")
def compose_greeting(input: ComposeGreetingInput) -> str:
    return f"{input.greeting}, {input.name}!"


@durable.workflow(name="tests.hello_async.activity")
async def greeting_workflow(ctx, name: str) -> str:
    return await ctx.step(compose_greeting, ComposeGreetingInput("Hello", name))


@durable.step(name="tests.hello_async.say_hello")
def say_hello(name: str) -> str:
    return f"Hello, {name}!"


@durable.workflow(name="tests.hello_async.parallel")
async def say_hello_workflow(ctx, _) -> list[str]:
    results = await asyncio.gather(
        ctx.step(say_hello, "user1"),
        ctx.step(say_hello, "user2"),
        ctx.step(say_hello, "user3"),
        ctx.step(say_hello, "user4"),
    )
    return list(sorted(results))


@durable.workflow(name="tests.hello_async.signal")
async def greeting_signal_workflow(ctx, _) -> list[str]:
    greetings: list[str] = []
    while True:
        name, payload = await ctx.wait_for_any_signal(["submit_greeting", "exit"])
        if name == "exit":
            return greetings
        greetings.append(f"Hello, {payload}")


@durable.workflow(name="tests.hello_async.child")
async def compose_greeting_child(ctx, input: ComposeGreetingInput) -> str:
    return f"{input.greeting}, {input.name}!"


@durable.workflow(name="tests.hello_async.parent")
async def greeting_parent(ctx, name: str) -> str:
    return await ctx.child(compose_greeting_child, ComposeGreetingInput("Hello", name))


@durable.step(name="tests.hello_async.never_complete", heartbeat_timeout="1h", concurrency=1)
def never_complete() -> None:
    raise AssertionError("never taken in these tests: its message is dropped")


@durable.step(name="tests.hello_async.cleanup")
def cleanup() -> None:
    CLEANED.append("cleanup")


@durable.workflow(name="tests.hello_async.cancellation")
async def cancellation_workflow(ctx, _) -> None:
    try:
        await ctx.step(never_complete)
    finally:
        await ctx.step(cleanup)


def test_hello_activity(durable_env):
    run = durable.start(greeting_workflow, "World")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "Hello, World!"


def test_hello_parallel_activity(durable_env):
    run = durable.start(say_hello_workflow)
    durable_env.run_until_idle()
    assert durable.result(run.id) == [f"Hello, user{i}!" for i in range(1, 5)]


def test_hello_signal(durable_env):
    run = durable.start(greeting_signal_workflow)
    durable_env.run_until_idle()
    for name in ("user1", "user2", "user3"):
        durable.signal(run.id, "submit_greeting", name)
    durable.signal(run.id, "exit")
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["Hello, user1", "Hello, user2", "Hello, user3"]


def test_hello_child_workflow(durable_env):
    run = durable.start(greeting_parent, "World")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "Hello, World!"


def test_hello_cancellation(durable_env):
    CLEANED.clear()
    run = durable.start(cancellation_workflow)
    durable_env.drop("durable.run_step")  # the activity never completes: nothing runs it
    durable_env.run_until_idle()
    durable.cancel(run.id, interrupt=True)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "cancelled"
    assert CLEANED == ["cleanup"]
