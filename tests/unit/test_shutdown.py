"""A worker's shutdown raised inside a body or a step is its process leaving, never their failure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import durable
from durable import shutdown
from durable.replay.attempt import run_attempt
from durable.replay.stepscope import StepInfo

from .replaykit import turn


class _Leaving(BaseException):
    """Stands for what a worker raises when it is told to stop (SystemExit in a pool child)."""


@pytest.fixture
def worker_shutting_down() -> Iterator[None]:
    probe = lambda exc: isinstance(exc, _Leaving)  # noqa: E731
    shutdown.recognise(probe)
    yield
    shutdown._probes.remove(probe)


@durable.step(name="tests.unit_shutdown.told_to_leave")
def told_to_leave() -> None:
    raise _Leaving()


def test_a_body_interrupted_by_its_worker_leaving_decides_nothing(worker_shutting_down: None) -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        raise _Leaving()

    with pytest.raises(_Leaving):
        turn(body)


def test_a_body_that_catches_the_stop_and_suspends_still_decides_nothing(worker_shutting_down: None) -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        try:
            ctx.sleep("1h")
        finally:
            raise _Leaving()  # the signal lands while the body unwinds

    with pytest.raises(_Leaving):
        turn(body)


def test_the_same_exception_fails_the_run_when_no_worker_is_leaving() -> None:
    def body(ctx: durable.Context, inp: Any) -> None:
        raise _Leaving()

    outcome = turn(body).outcome
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "_Leaving"


def test_a_step_interrupted_by_its_worker_leaving_is_not_a_failed_attempt(worker_shutting_down: None) -> None:
    info = StepInfo("run-1", 0, 1, told_to_leave.name)
    with pytest.raises(_Leaving):
        run_attempt(told_to_leave, info, {}, lambda progress: None)


def test_a_step_raising_the_same_outside_a_shutdown_is_a_failed_attempt() -> None:
    info = StepInfo("run-1", 0, 1, told_to_leave.name)
    output, error, retryable = run_attempt(told_to_leave, info, {}, lambda progress: None)
    assert output is None and error is not None and error["type"] == "_Leaving"
