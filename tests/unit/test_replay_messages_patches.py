"""The pure core of ``ctx.signal`` / ``ctx.publish_event`` / ``ctx.start`` and of patch markers."""

from __future__ import annotations

from typing import Any

import durable
from durable.replay.context import TurnState
from durable.replay.core import replay
from durable.replay.history import COMPLETED, FAILED, Record
from durable.replay.messages import started_run_id

from .replaykit import LIMITS, RUN, T0, Workflow, done, remote, turn


@durable.workflow(name="tests.unit_messages.target")
def target(ctx: durable.Context, inp: Any) -> Any:
    return inp


def _turn(body: Any, records: list[Record] = (), runs: dict[str, tuple[str, str]] | None = None) -> Any:
    state = TurnState(records={r.seq: r for r in records}, signals=[], find_run=(runs or {}).get)
    outcome = replay(
        Workflow(fn=body, name=RUN.workflow),
        RUN,
        state,
        clock=lambda: T0,
        limits=LIMITS,
        flush=lambda s: None,
        renew=lambda: None,
    )
    return outcome, state


def _signal_body(ctx: durable.Context, inp: Any) -> Any:
    try:
        ctx.signal("run-2", "hello", {"n": 1})
    except durable.RunNotFound as exc:
        return [exc.code, exc.message]
    return "sent"


def test_a_new_signal_is_recorded_and_goes_out_with_the_turn() -> None:
    outcome, state = _turn(_signal_body, runs={"run-2": ("x", "suspended")})
    assert outcome.output == "sent"
    rec = state.records[0]
    assert (rec.kind, rec.name, rec.status, rec.input) == (
        "send_signal",
        "hello",
        COMPLETED,
        {"run_id": "run-2", "payload": {"n": 1}},
    )
    assert [(m.kind, m.run_id, m.payload) for m in state.outgoing] == [("signal", "run-2", {"n": 1})]


def test_a_replayed_signal_sends_nothing_and_needs_no_lookup() -> None:
    recorded = done(0, "hello", None, kind="send_signal")
    outcome, state = _turn(_signal_body, [recorded], runs=None)
    assert outcome.output == "sent"
    assert state.outgoing == []


def test_a_signal_to_no_run_is_recorded_failed_and_raised_again_on_replay() -> None:
    outcome, state = _turn(_signal_body, runs={})
    assert outcome.output == ["not_found", "no run has id 'run-2'; nothing was sent"]
    assert (state.records[0].status, state.records[0].error["type"]) == (FAILED, "RunNotFound")
    again, state = _turn(_signal_body, [state.records[0]])
    assert again.output == outcome.output
    assert state.outgoing == []


def test_start_derives_its_run_id_from_the_run_and_position() -> None:
    outcome, state = _turn(lambda ctx, inp: ctx.start(target, 5))
    started = started_run_id(RUN.id, 0)
    assert outcome.output == started
    assert [(m.kind, m.run_id, m.name, m.payload) for m in state.outgoing] == [
        ("start", started, "tests.unit_messages.target", 5)
    ]


def test_publish_event_is_recorded_once() -> None:
    body = lambda ctx, inp: ctx.publish_event("shipped", {"order": 1})  # noqa: E731
    _, state = _turn(body)
    assert [(m.kind, m.name) for m in state.outgoing] == [("event", "shipped")]
    _, again = _turn(body, [state.records[0]])
    assert again.outgoing == []


# -- patch markers ------------------------------------------------------------------------------


def test_deprecate_patch_on_a_new_run_records_the_marker() -> None:
    t = turn(lambda ctx, inp: [ctx.deprecate_patch("tests.change"), ctx.step(remote, 1)])
    assert (t.state.records[0].kind, t.state.records[0].name) == ("patch", "tests.change")
    assert t.state.records[1].kind == "step"


def test_deprecate_patch_replays_histories_with_and_without_the_marker() -> None:
    def body(ctx: durable.Context, inp: Any) -> Any:
        ctx.deprecate_patch("tests.change")
        return ctx.step(remote, 1)

    marker = done(0, "tests.change", None, kind="patch")
    assert turn(body, [marker, done(1, "tests.unit_replay.remote", 10)]).outcome.output == 10
    assert turn(body, [done(0, "tests.unit_replay.remote", 10)]).outcome.output == 10


def test_any_primitive_steps_over_the_marker_of_a_deleted_patched_call() -> None:
    marker = done(0, "tests.change", None, kind="patch")
    t = turn(lambda ctx, inp: ctx.step(remote, 1), [marker, done(1, "tests.unit_replay.remote", 10)])
    assert t.outcome.output == 10


def test_patched_steps_over_the_markers_of_other_changes() -> None:
    old = done(0, "tests.old-change", None, kind="patch")
    mine = done(1, "tests.change", None, kind="patch")
    t = turn(lambda ctx, inp: ctx.patched("tests.change"), [old, mine])
    assert t.outcome.output is True
    assert list(t.state.records) == [0, 1]


# -- completion tokens --------------------------------------------------------------------------


def test_a_completion_token_names_its_attempt_whatever_the_run_id_holds() -> None:
    from durable.replay.stepscope import StepInfo, parse_token

    info = StepInfo("schedule:nightly.report:2030-01-01T03:00", 4, 2, "tests.step", secret="s3cr3t_-x")
    assert parse_token(info.token) == ("schedule:nightly.report:2030-01-01T03:00", 4, 2, "s3cr3t_-x")
    assert "s3cr3t" not in repr(info)


def test_a_local_step_has_no_completion_token() -> None:
    import pytest

    from durable.replay.stepscope import StepInfo

    with pytest.raises(durable.DurableError, match="local step cannot complete later"):
        StepInfo("run-1", 0, 1, "tests.step").token  # noqa: B018 - the property raises
