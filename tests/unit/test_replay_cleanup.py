"""Suspension is invisible to the body over many turns: code that runs on the way out of a
suspended turn (finally, __exit__, except BaseException) records and sends nothing, so cleanup
runs once, when the body really leaves the block, and the history replays in order."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import durable

from .replaykit import calls, finish_sent, stored, turn


@durable.step(name="tests.unit_cleanup.a")
def a() -> str:
    return "a"


@durable.step(name="tests.unit_cleanup.b")
def b() -> str:
    return "b"


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


def drive(body: Callable[[Any, Any], Any], turns: int = 10) -> tuple[Any, list[str], list[list[str]]]:
    """Run turns of ``body``, completing what each sent before the next; return the last outcome,
    the names recorded in position order, and the names each turn sent."""
    records: dict = {}
    sent: list[list[str]] = []
    for _ in range(turns):
        result = turn(body, stored(records))
        records = result.state.records
        sent.append([rec.name for rec in result.state.dispatch])
        if result.outcome.status != "suspended":
            break
        finish_sent(records, output="done")
    names = [records[seq].name for seq in sorted(records)]
    return result.outcome, names, sent


def test_the_finally_reproducer_completes_with_a_a_b_recorded_in_order() -> None:
    def wf(ctx: Any, _: Any) -> Any:
        try:
            ctx.step(a)
            return ctx.step(a)
        finally:
            ctx.step(b)

    outcome, names, sent = drive(wf)
    assert outcome.status == "completed", outcome.error
    assert names == ["tests.unit_cleanup.a", "tests.unit_cleanup.a", "tests.unit_cleanup.b"]
    # One send per turn: the cleanup only once the long step ended.
    assert sent == [["tests.unit_cleanup.a"], ["tests.unit_cleanup.a"], ["tests.unit_cleanup.b"], []]


def test_a_context_managers_exit_runs_its_step_once_after_the_block() -> None:
    @contextlib.contextmanager
    def tidy(ctx: Any) -> Iterator[None]:
        try:
            yield
        finally:
            ctx.step(b)

    def wf(ctx: Any, _: Any) -> Any:
        with tidy(ctx):
            return ctx.step(a)

    outcome, names, sent = drive(wf)
    assert outcome.status == "completed"
    assert names == ["tests.unit_cleanup.a", "tests.unit_cleanup.b"]
    assert sent == [["tests.unit_cleanup.a"], ["tests.unit_cleanup.b"], []]


def test_except_base_exception_runs_its_step_only_for_a_real_error() -> None:
    def wf(ctx: Any, _: Any) -> Any:
        try:
            ctx.step(a)
            ctx.step(a)
        except BaseException:  # noqa: BLE001 - a suspension passing through must not run this
            ctx.step(b)
            raise
        return "ok"

    outcome, names, sent = drive(wf)
    assert outcome.status == "completed"
    assert names == ["tests.unit_cleanup.a", "tests.unit_cleanup.a"]
    assert sent == [["tests.unit_cleanup.a"], ["tests.unit_cleanup.a"], []]


def test_ctx_patched_on_the_way_out_of_a_suspended_turn_suspends_again() -> None:
    seen: list[bool] = []

    def wf(ctx: Any, _: Any) -> Any:
        try:
            return ctx.step(a)
        finally:
            seen.append(ctx.patched("x"))

    result = turn(wf)
    assert result.outcome.status == "suspended"
    assert list(result.state.records) == [0] and seen == []
