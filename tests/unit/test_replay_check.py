"""Unit tests for durable.replay.check and durable.testing.replay_history: a stored history
replayed against changed code, with no database and no side effects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durable.definitions import Workflow
from durable.errors import InvalidInput, NonDeterminismError
from durable.replay import check
from durable.replay.history import PENDING, Record
from durable.testing import replay_history

from .replaykit import RUN, T0, calls, done, flaky, other, pair, remote


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


def original(ctx: Any, inp: Any) -> Any:
    a = ctx.step(remote, inp["n"])
    ctx.sleep("1h")
    return ctx.step(other) + str(a)


def reordered(ctx: Any, inp: Any) -> Any:
    ctx.sleep("1h")  # the sleep moved before the step: position 0 now asks for a timer
    return ctx.step(remote, inp["n"])


def extended(ctx: Any, inp: Any) -> Any:
    out = original(ctx, inp)
    ctx.step(pair, 1, 2)  # a new position past the recorded ones
    return out


HISTORY = {
    0: done(0, "tests.unit_replay.remote", 10),
    1: done(1, "sleep", None, kind="sleep"),
}


def verdict(body: Any, records: dict[int, Record] = HISTORY) -> check.Verdict:
    return check.check(Workflow(fn=body, name=RUN.workflow), RUN, dict(records), at=T0)


def test_the_unchanged_code_replays_a_history_cut_short_of_its_end() -> None:
    found = verdict(original)
    assert found.ok and found.positions == 2
    assert calls == []  # the next step (other) was neither run nor sent


def test_code_that_asks_for_another_primitive_at_a_recorded_position_breaks_the_history() -> None:
    found = verdict(reordered)
    assert isinstance(found.error, NonDeterminismError)
    assert found.error.details == {
        "seq": 0,
        "recorded": ["step", "tests.unit_replay.remote"],
        "requested": ["sleep", "sleep"],
    }


def test_code_that_only_adds_positions_after_the_history_replays() -> None:
    assert verdict(extended).ok


def test_a_body_that_catches_the_error_still_breaks() -> None:
    def catching(ctx: Any, inp: Any) -> Any:
        try:
            ctx.step(other)
        except Exception:  # noqa: BLE001 - the point of the test
            return "swallowed"

    assert isinstance(verdict(catching).error, NonDeterminismError)


def test_a_pending_local_step_is_not_run_by_a_check() -> None:
    def body(ctx: Any, inp: Any) -> Any:
        return ctx.step(flaky)

    pending = {
        0: Record(seq=0, kind="step", name="tests.unit_replay.flaky", status=PENDING, stored_as=(PENDING, 1))
    }
    assert verdict(body, pending).ok
    assert calls == []  # a turn would run its next attempt now; a check does not


def test_compensations_recorded_past_the_body_are_not_compared_with_it() -> None:
    records = {
        **HISTORY,
        1_000_000_000: done(1_000_000_000, "compensate:tests.unit_replay.remote", None, "compensation"),
    }
    assert verdict(original, records).ok


def test_a_stored_input_the_schema_refuses_is_reported() -> None:
    class Strict:
        @staticmethod
        def model_validate(value: Any) -> Any:
            raise ValueError("n must be a string now")

    workflow = Workflow(fn=original, name=RUN.workflow, input_schema=Strict)
    assert isinstance(check.check(workflow, RUN, dict(HISTORY), at=T0).error, InvalidInput)


def test_an_exported_history_replays_through_the_testing_helper(tmp_path: Any) -> None:
    exported = check.to_json(RUN, dict(HISTORY), at=T0, status="suspended")
    path = tmp_path / "history.json"
    path.write_text(json.dumps(exported))
    assert replay_history(path, Workflow(fn=original, name=RUN.workflow)).ok
    assert replay_history(json.dumps(exported), Workflow(fn=extended, name=RUN.workflow)).ok
    with pytest.raises(
        NonDeterminismError,
        match="at position 0 the workflow asked for sleep 'sleep' where its history holds step",
    ):
        replay_history(exported, Workflow(fn=reordered, name=RUN.workflow))


def test_something_that_is_not_an_exported_history_is_refused_clearly() -> None:
    with pytest.raises(InvalidInput, match="durable show RUN --json"):
        replay_history({"positions": []}, Workflow(fn=original, name=RUN.workflow))
