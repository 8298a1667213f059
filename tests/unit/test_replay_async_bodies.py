"""``async def`` bodies through the pure replay core: answers at idle points, gather as a fan,
positions in the same order on every replay, and what a body may not await."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import timedelta
from typing import Any

import pytest

import durable
from durable.replay.asyncbody import RESUMED
from durable.replay.history import COMPLETED, PENDING, BufferedSignal, Record

from .replaykit import RUN, T0, calls, done, finish_sent, other, pair, remote, stored, turn


@durable.step(name="tests.unit_async.local_a", local=True)
def local_a(x: int) -> int:
    calls.append(f"a{x}")
    return x + 1


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


def rows(records: dict[int, Record]) -> list[tuple[Any, ...]]:
    return [
        (r.seq, r.kind, r.name, r.fan, r.fail_fast) for r in sorted(records.values(), key=lambda r: r.seq)
    ]


def test_local_steps_awaited_in_turn_run_in_one_turn() -> None:
    async def body(ctx: Any, _: Any) -> int:
        total = 0
        for i in range(3):
            total += await ctx.step(local_a, i)
        return total

    result = turn(body)
    assert (result.outcome.status, result.outcome.output) == ("completed", 6)
    assert calls == ["a0", "a1", "a2"]
    assert RESUMED not in {r.kind for r in result.state.records.values()}


def test_gather_of_three_steps_records_what_ctx_all_records() -> None:
    async def gathered(ctx: Any, _: Any) -> list[int]:
        return list(await asyncio.gather(ctx.step(remote, 1), ctx.step(remote, 2), ctx.step(remote, 3)))

    def all_of(ctx: Any, _: Any) -> list[int]:
        return ctx.all([ctx.defer(remote, 1), ctx.defer(remote, 2), ctx.defer(remote, 3)])

    first = turn(gathered)
    assert first.outcome.status == "suspended"
    assert rows(first.state.records) == rows(turn(all_of).state.records)
    assert [r.fan for r in first.state.records.values()] == [0, 0, 0]
    assert [r.name for r in first.state.dispatch] == ["tests.unit_replay.remote"] * 3
    records = stored(first.state.records)
    for rec in records.values():
        rec.status, rec.output, rec.enqueued_at = COMPLETED, rec.input["args"][0] * 10, None
    second = turn(gathered, records)
    assert (second.outcome.status, second.outcome.output) == ("completed", [10, 20, 30])


def test_create_task_of_a_primitive_takes_its_position_when_it_first_runs() -> None:
    async def body(ctx: Any, _: Any) -> list[Any]:
        task = asyncio.create_task(ctx.step(local_a, 5))
        now = ctx.now()
        return [await task, now.isoformat()]

    result = turn(body)
    assert result.outcome.output == [6, T0.isoformat()]
    assert [(r.seq, r.kind) for r in result.state.records.values()] == [(0, "value"), (1, "step")]


def test_a_step_and_a_signal_resolved_apart_record_where_and_replay_in_the_same_order() -> None:
    # One branch runs three steps while another waits for a signal and then runs one: resolving
    # the recorded answers at once on a replay would let the signal's branch run ahead.
    async def body(ctx: Any, _: Any) -> list[Any]:
        async def steps() -> list[int]:
            return [await ctx.step(local_a, i) for i in range(3)]

        async def signalled() -> int:
            payload = await ctx.wait_for_signal("go")
            return await ctx.step(local_a, payload)

        return list(await asyncio.gather(steps(), signalled()))

    first = turn(body)
    assert first.outcome.status == "suspended"
    kinds = [(r.kind, r.name) for r in sorted(first.state.records.values(), key=lambda r: r.seq)]
    assert kinds[:3] == [("step", local_a.name), ("signal", "go"), (RESUMED, RESUMED)]
    history = [(r.seq, r.kind) for r in first.state.records.values()]
    records = stored(first.state.records)
    go = BufferedSignal(id=1, name="go", payload=100)
    second = turn(body, records, [go])
    assert (second.outcome.status, second.outcome.output) == ("completed", [[1, 2, 3], 101])
    assert [(r.seq, r.kind) for r in second.state.records.values()][: len(history)] == history
    third = turn(body, stored(second.state.records))
    assert (third.outcome.status, third.outcome.output) == ("completed", [[1, 2, 3], 101])
    assert calls == ["a0", "a1", "a2", "a100"]


def test_asyncio_sleep_in_a_body_fails_the_run_naming_it() -> None:
    async def body(ctx: Any, _: Any) -> None:
        await ctx.step(local_a, 1)
        with contextlib.suppress(Exception):  # caught or not, the run fails
            await asyncio.sleep(1)

    result = turn(body)
    assert result.outcome.status == "failed"
    error = result.outcome.error
    assert error["code"] == "nondeterministic_await"
    assert "asyncio.sleep()" in error["message"]
    assert error["details"]["at"].endswith(f"{__file__.rsplit('/', 1)[-1]}:{_line_of('asyncio.sleep(1)')}")


def test_awaiting_a_future_nothing_resolves_fails_the_run_naming_it() -> None:
    async def body(ctx: Any, _: Any) -> None:
        await asyncio.Event().wait()

    result = turn(body)
    assert result.outcome.error["code"] == "nondeterministic_await"
    assert "Event.wait" in result.outcome.error["message"]


def test_asyncio_sleep_zero_is_only_a_yield_and_is_allowed() -> None:
    async def body(ctx: Any, _: Any) -> int:
        await asyncio.sleep(0)
        return await ctx.step(local_a, 1)

    assert turn(body).outcome.output == 2


def test_a_durable_sleep_suspends_until_its_wake_at() -> None:
    async def body(ctx: Any, _: Any) -> str:
        await ctx.sleep("1h")
        return "woke"

    first = turn(body)
    assert (first.outcome.status, first.outcome.wake_at) == ("suspended", T0 + timedelta(hours=1))
    later = turn(body, stored(first.state.records), now=T0 + timedelta(hours=1))
    assert later.outcome.output == "woke"


def test_finally_runs_when_the_turn_suspends_and_the_body_records_nothing_more() -> None:
    seen = []

    async def body(ctx: Any, _: Any) -> None:
        try:
            await ctx.wait_for_signal("never")
        finally:
            seen.append("finally")
            try:
                await ctx.step(local_a, 1)
            except BaseException as exc:  # noqa: BLE001 - the sticky stop, under test
                seen.append(type(exc).__name__)

    result = turn(body)
    assert result.outcome.status == "suspended"
    assert seen == ["finally", "Suspend"]
    assert [r.kind for r in result.state.records.values()] == ["signal"]


def test_an_interrupting_cancel_raises_cancelled_at_every_wait() -> None:
    raised = []

    async def body(ctx: Any, _: Any) -> None:
        async def waits(name: str) -> None:
            try:
                await ctx.wait_for_signal(name)
            except durable.Cancelled:
                raised.append(name)
                raise

        await asyncio.gather(waits("a"), waits("b"))

    run = RUN_CANCELLED
    result = turn(body, run=run)
    assert result.outcome.status == "cancelled"
    assert raised == ["a", "b"]
    assert [r.kind for r in sorted(result.state.records.values(), key=lambda r: r.seq)] == [
        "signal",
        "signal",
        "cancel",
    ]
    raised.clear()
    again = turn(body, stored(result.state.records), run=run)
    assert again.outcome.status == "cancelled"
    assert raised == ["a", "b"]


def test_a_branch_left_running_when_the_body_returns_is_cancelled_quietly() -> None:
    async def body(ctx: Any, _: Any) -> str:
        asyncio.create_task(ctx.wait_for_signal("later"))
        await ctx.step(local_a, 1)
        return "done"

    result = turn(body)
    assert (result.outcome.status, result.outcome.output) == ("completed", "done")


def test_continue_as_new_from_a_branch_ends_the_turn() -> None:
    async def body(ctx: Any, n: Any) -> None:
        await ctx.step(local_a, 1)
        ctx.continue_as_new({"n": 2})

    result = turn(body)
    assert (result.outcome.status, result.outcome.next_input) == ("continued", {"n": 2})


def test_a_replay_that_takes_another_position_raises_non_determinism() -> None:
    async def body(ctx: Any, _: Any) -> None:
        await ctx.step(other)

    result = turn(body, [done(0, pair.name, [1, 2])])
    assert result.outcome.status == "failed"
    assert result.outcome.error["type"] == "NonDeterminismError"


def test_ctx_all_awaited_records_a_fan_and_answers_in_order() -> None:
    async def body(ctx: Any, _: Any) -> list[Any]:
        return await ctx.all([ctx.defer(remote, 1), ctx.defer(remote, 2)])

    first = turn(body)
    assert [r.fan for r in first.state.records.values()] == [0, 0]
    records = stored(first.state.records)
    assert finish_sent(records, 7) == [remote.name, remote.name]
    assert turn(body, records).outcome.output == [7, 7]


def test_a_lone_new_step_is_sent_once_and_pending_steps_wake_the_run() -> None:
    async def body(ctx: Any, _: Any) -> int:
        return await ctx.step(remote, 4)

    first = turn(body)
    assert first.outcome.status == "suspended"
    assert [r.status for r in first.state.records.values()] == [PENDING]
    assert len(first.state.dispatch) == 1 and first.state.records[0].fan is None


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(n for n, line in enumerate(source, 1) if text in line and "_line_of" not in line)


RUN_CANCELLED = dataclasses.replace(RUN, cancel_request={"interrupt": True, "reason": "stop"})


def test_a_replay_check_walks_an_async_body_over_its_history() -> None:
    from durable.definitions import Workflow
    from durable.replay.check import check

    async def body(ctx: Any, _: Any) -> list[int]:
        return list(await asyncio.gather(ctx.step(remote, 1), ctx.step(remote, 2)))

    async def changed(ctx: Any, _: Any) -> int:
        return await ctx.step(other)

    records = stored(turn(body).state.records)
    assert check(Workflow(fn=body, name=RUN.workflow), RUN, records).ok
    verdict = check(Workflow(fn=changed, name=RUN.workflow), RUN, records)
    assert type(verdict.error).__name__ == "NonDeterminismError"


def test_keyboard_interrupt_in_an_async_body_fails_the_run_with_its_cause() -> None:
    async def body(ctx: Any, _: Any) -> None:
        await ctx.step(local_a, 1)
        raise KeyboardInterrupt("^C in the body")

    result = turn(body)
    assert result.outcome.status == "failed"
    assert (result.outcome.error["type"], result.outcome.error["message"]) == (
        "KeyboardInterrupt",
        "^C in the body",
    )


def test_the_logger_is_quiet_while_an_async_body_replays(caplog: pytest.LogCaptureFixture) -> None:
    async def body(ctx: Any, _: Any) -> None:
        await ctx.step(remote, 1)
        ctx.logger.warning("after the step (replaying: %s)", ctx.is_replaying)
        await ctx.sleep("1h")

    first = turn(body)
    records = stored(first.state.records)
    finish_sent(records, 10)
    with caplog.at_level("WARNING", logger="durable.workflow"):
        second = turn(body, records)
        turn(body, stored(second.state.records))
    assert [r.getMessage() for r in caplog.records] == ["after the step (replaying: False)"]


def test_branches_left_behind_leave_no_asyncio_complaint(caplog: pytest.LogCaptureFixture) -> None:
    import gc

    async def boom() -> None:
        raise ValueError("never retrieved by the body")

    async def body(ctx: Any, _: Any) -> None:
        asyncio.create_task(ctx.wait_for_signal("a"))  # suspended with the turn
        asyncio.create_task(boom())
        asyncio.create_task(asyncio.Event().wait())  # blocked on what nothing resolves
        await asyncio.gather(ctx.step(remote, 1), ctx.step(remote, 2))

    with caplog.at_level("DEBUG", logger="asyncio"):
        assert turn(body).outcome.status == "suspended"
        gc.collect()
    assert [r for r in caplog.records if r.name == "asyncio"] == []


async def _waits_for(ctx: Any) -> None:
    # A task, not the bare coroutine: wait_for is refused before it would wrap a coroutine, which
    # Python would then report as never awaited.
    await asyncio.wait_for(asyncio.ensure_future(ctx.step(remote, 1)), timeout=5)


async def _times_out(ctx: Any) -> None:
    async with asyncio.timeout(5):
        await ctx.step(remote, 1)


async def _to_thread(ctx: Any) -> None:
    await asyncio.to_thread(print, "from a thread")


async def _connects(ctx: Any) -> None:
    await asyncio.open_connection("127.0.0.1", 9)


@pytest.mark.parametrize(
    ("awaits", "named"),
    [
        (_waits_for, "asyncio.wait_for()"),
        (_times_out, "asyncio.Timeout."),
        (_to_thread, "asyncio.to_thread()"),
        (_connects, "asyncio.open_connection()"),
    ],
)
def test_clocks_threads_and_sockets_in_a_body_fail_the_run_naming_them(awaits: Any, named: str) -> None:
    async def body(ctx: Any, _: Any) -> None:
        await awaits(ctx)

    error = turn(body).outcome.error
    assert error["code"] == "nondeterministic_await"
    assert named in error["message"], error["message"]
    assert "test_replay_async_bodies.py" in error["details"]["at"]
