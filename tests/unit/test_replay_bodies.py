"""Hostile or careless bodies: suspension is sticky, a primitive from another thread is refused,
the engine's stop reaches every primitive, and any BaseException escaping a body fails the run."""

# ruff: noqa: SIM105  (the bodies under test swallow exceptions on purpose, the way careless code does)

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

import durable
from durable.definitions import Retry
from durable.errors import _ControlFlow
from durable.replay.history import COMPLETED, FAILED, PENDING, Record

from .replaykit import T0, calls, done, pair, remote, turn


@durable.step(name="tests.unit_bodies.cleanup", local=True)
def cleanup() -> str:
    calls.append("cleanup")
    return "cleaned"


@durable.step(name="tests.unit_bodies.interrupted", local=True, retry=Retry(max_attempts=1))
def interrupted() -> None:
    raise KeyboardInterrupt("operator pressed ^C")


@durable.step(name="tests.unit_bodies.exits", local=True, retry=Retry(max_attempts=2, initial="10s"))
def exits() -> None:
    raise SystemExit(3)


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


def swallow_then_return(ctx: Any, _: Any) -> str:
    try:
        ctx.sleep("1h")
    except BaseException:  # noqa: BLE001 - the careless body under test
        pass
    return "skipped the sleep"


def test_a_body_that_swallows_the_suspension_still_suspends_at_that_primitive() -> None:
    result = turn(swallow_then_return)
    assert result.outcome.status == "suspended"
    assert result.outcome.wake_at == T0 + timedelta(hours=1)
    assert result.outcome.output is None


def test_return_in_finally_does_not_complete_a_suspended_turn() -> None:
    def body(ctx: Any, _: Any) -> str:
        try:
            ctx.step(remote, 1)
        finally:
            return "finally wins"  # noqa: B012 - the careless body under test

    result = turn(body)
    assert result.outcome.status == "suspended"
    assert [rec.name for rec in result.state.records.values()] == ["tests.unit_replay.remote"]


def test_primitives_after_a_swallowed_suspension_record_run_and_send_nothing() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            ctx.step(remote, 1)
        except BaseException:  # noqa: BLE001
            pass
        for primitive in (
            lambda: ctx.step(cleanup),
            ctx.now,
            lambda: ctx.sleep("1s"),
            lambda: ctx.step(remote, 2),
        ):
            try:
                primitive()
            except BaseException:  # noqa: BLE001
                pass
        return "done"

    result = turn(body)
    assert result.outcome.status == "suspended"
    assert list(result.state.records) == [0]
    assert [rec.input for rec in result.state.dispatch] == [{"args": [1], "kwargs": {}}]
    assert calls == [] and result.flushes == []
    # The wake is the suspended primitive's (a dispatched step looks again after redispatch_after).
    assert result.outcome.wake_at == T0 + timedelta(minutes=1)


def test_a_finally_cleanup_step_records_nothing_while_the_turn_suspends() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            return ctx.step(remote, 1)
        finally:
            ctx.step(cleanup)

    result = turn(body)
    assert result.outcome.status == "suspended"
    assert list(result.state.records) == [0] and calls == []


def test_an_error_raised_after_a_swallowed_suspension_still_suspends() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            ctx.sleep("1h")
        except BaseException:  # noqa: BLE001
            raise ValueError("not a failure of the run") from None

    assert turn(body).outcome.status == "suspended"


def test_continue_as_new_after_a_swallowed_suspension_still_suspends() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            ctx.sleep("1h")
        except BaseException:  # noqa: BLE001
            ctx.continue_as_new({"n": 2})

    assert turn(body).outcome.status == "suspended"


def test_a_swallowed_continue_as_new_still_continues() -> None:
    def body(ctx: Any, _: Any) -> Any:
        try:
            ctx.continue_as_new({"n": 2})
        except BaseException:  # noqa: BLE001
            pass
        ctx.step(cleanup)
        return "ignored"

    result = turn(body)
    assert (result.outcome.status, result.outcome.next_input) == ("continued", {"n": 2})
    assert calls == [] and result.state.records == {}


def test_a_body_that_resumes_normally_after_its_step_completed_is_unaffected() -> None:
    result = turn(swallow_then_return, [done(0, "sleep", None, kind="sleep")])
    assert (result.outcome.status, result.outcome.output) == ("completed", "skipped the sleep")


def test_a_primitive_called_from_another_thread_fails_the_run_naming_the_cause() -> None:
    def body(ctx: Any, _: Any) -> str:
        worker = threading.Thread(target=lambda: ctx.step(remote, 1), name="helper")
        worker.start()
        worker.join()
        return "the thread's step was lost"

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(threading, "excepthook", lambda args: None)  # the thread dies quietly
        result = turn(body)
    assert result.outcome.status == "failed"
    assert result.outcome.error is not None
    assert result.outcome.error["code"] == "wrong_thread"
    assert "'helper'" in result.outcome.error["message"]
    assert result.state.records == {} and result.state.dispatch == []


@pytest.mark.parametrize(
    ("raised", "kind", "message"),
    [(KeyboardInterrupt("stop"), "KeyboardInterrupt", "stop"), (SystemExit(3), "SystemExit", "3")],
)
def test_a_base_exception_escaping_the_body_fails_the_run_with_its_type(
    raised: BaseException, kind: str, message: str
) -> None:
    def body(ctx: Any, _: Any) -> None:
        ctx.step(pair, 1, 2)
        raise raised

    outcome = turn(body).outcome
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert (outcome.error["type"], outcome.error["message"]) == (kind, message)


def test_keyboard_interrupt_in_a_local_step_fails_the_attempt_with_its_cause() -> None:
    def body(ctx: Any, _: Any) -> Any:
        return ctx.step(interrupted)

    result = turn(body)
    rec = result.state.records[0]
    assert rec.status == FAILED
    assert rec.error is not None and rec.error["type"] == "KeyboardInterrupt"
    assert result.outcome.status == "failed"
    assert result.outcome.error is not None and result.outcome.error["message"] == "operator pressed ^C"


def test_system_exit_in_a_local_step_is_a_failed_attempt_the_retry_policy_handles() -> None:
    result = turn(lambda ctx, _: ctx.step(exits))
    rec = result.state.records[0]
    assert (rec.status, rec.attempt) == (PENDING, 2)
    assert rec.error is not None and rec.error["type"] == "SystemExit"
    assert result.outcome.status == "suspended"


class Stopped(_ControlFlow):
    pass


def test_the_engine_stop_is_raised_at_the_next_primitive_and_out_of_replay() -> None:
    stop: list[BaseException] = []

    def body(ctx: Any, _: Any) -> str:
        ctx.step(pair, 1, 2)
        stop.append(Stopped())
        try:
            ctx.step(cleanup)
        except BaseException:  # noqa: BLE001 - swallowing the stop changes nothing
            pass
        return "done"

    with pytest.raises(Stopped):
        turn(body, stopped=lambda: stop[0] if stop else None)
    assert calls == []


def test_an_engine_stop_noticed_only_after_the_body_returned_is_still_raised() -> None:
    stop: list[BaseException] = []

    def body(ctx: Any, _: Any) -> str:
        stop.append(Stopped())  # e.g. the turn ran past its time limit in pure Python code
        return "done"

    with pytest.raises(Stopped):
        turn(body, stopped=lambda: stop[0] if stop else None)


def test_a_swallowed_control_flow_error_from_flush_sticks() -> None:
    from durable.definitions import Workflow
    from durable.replay.context import TurnState
    from durable.replay.core import replay

    from .replaykit import LIMITS, RUN

    def flush(state: TurnState) -> None:
        raise Stopped()

    def body(ctx: Any, _: Any) -> str:
        try:
            ctx.step(pair, 1, 2)
        except BaseException:  # noqa: BLE001
            pass
        return "done"

    with pytest.raises(Stopped):
        replay(
            Workflow(fn=body, name=RUN.workflow),
            RUN,
            TurnState(records={}, signals=[]),
            clock=lambda: T0,
            limits=LIMITS,
            flush=flush,
            renew=lambda: None,
        )


def test_a_recorded_history_replays_unchanged_after_a_swallowed_suspension() -> None:
    step = Record(
        seq=0,
        kind="step",
        name="tests.unit_replay.remote",
        status=COMPLETED,
        output=10,
        stored_as=(COMPLETED, 1),
    )

    def body(ctx: Any, _: Any) -> Any:
        out = "skipped"
        try:
            out = ctx.step(remote, 1)
        except BaseException:  # noqa: BLE001
            pass
        return out

    assert turn(body).outcome.status == "suspended"
    assert turn(body, [step]).outcome.output == 10
