"""Shared pieces for the replay() unit tests: a fixed clock, limits, steps and a turn runner."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import durable
from durable.definitions import Retry, Workflow
from durable.errors import ApplicationError
from durable.replay.context import RunFacts, TurnState
from durable.replay.core import replay
from durable.replay.history import COMPLETED, BufferedSignal, Decision, Limits, Record

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LIMITS = Limits(
    reconcile_interval=timedelta(days=1),
    redispatch_after=timedelta(minutes=1),
    timeout_grace=timedelta(seconds=5),
    heartbeat_throttle=timedelta(seconds=10),
    default_queue="tests-unit-queue",
)
RUN = RunFacts(id="run-1", workflow="tests.unit_replay.wf", version="1", namespace=None, input={"n": 1})
calls: list[str] = []


@durable.step(name="tests.unit_replay.remote", timeout="1m")
def remote(x: int) -> int:
    calls.append("remote")
    return x * 10


@durable.step(name="tests.unit_replay.other")
def other() -> str:
    calls.append("other")
    return "other"


@durable.step(name="tests.unit_replay.pair", local=True)
def pair(a: int, b: int) -> tuple[int, int]:
    durable.heartbeat({"phase": "pairing"})
    return (a, b)


@durable.step(name="tests.unit_replay.flaky", local=True, retry=Retry(max_attempts=3, initial="10s"))
def flaky() -> int:
    calls.append(f"flaky attempt {durable.step_info().attempt}")
    raise ValueError("flaky failed")


@durable.step(name="tests.unit_replay.once", local=True, retry=Retry(max_attempts=1))
def once() -> int:
    raise ApplicationError("card declined", code="declined")


@dataclass
class Turn:
    """One replay() call and what it reported through its callbacks."""

    outcome: Decision
    state: TurnState
    flushes: list[TurnState] = field(default_factory=list)
    renews: list[None] = field(default_factory=list)


def turn(
    body: Callable[[Any, Any], Any],
    records: Sequence[Record] | dict[int, Record] = (),
    signals: Sequence[BufferedSignal] = (),
    *,
    now: datetime = T0,
    stopped: Callable[[], BaseException | None] | None = None,
    exposed: dict[str, Any] | None = None,
    limits: Limits = LIMITS,
    run: RunFacts = RUN,
    read_at: datetime | None = None,
) -> Turn:
    """Replay ``body`` once at ``now`` over ``records`` and ``signals`` (as ``run``, with its
    ``exposed`` values as stored; ``records`` read at ``read_at``, when given)."""
    recs = records if isinstance(records, dict) else {r.seq: r for r in records}
    state = TurnState(records=recs, signals=list(signals), exposed=dict(exposed or {}), read_at=read_at)
    flushes: list[TurnState] = []
    renews: list[None] = []
    outcome = replay(
        Workflow(fn=body, name=run.workflow),
        run,
        state,
        clock=lambda: now,
        limits=limits,
        flush=flushes.append,
        renew=lambda: renews.append(None),
        stopped=stopped,
    )
    return Turn(outcome, state, flushes, renews)


def done(seq: int, name: str, output: Any, kind: str = "step") -> Record:
    """A completed position, as loaded from an earlier turn."""
    return Record(seq=seq, kind=kind, name=name, status=COMPLETED, output=output, stored_as=(COMPLETED, 1))


@durable.step(name="tests.unit_replay.beating", heartbeat_timeout="10s")
def beating() -> None:
    calls.append("beating")


def stored(records: dict[int, Record]) -> dict[int, Record]:
    """The records as the next turn loads them: every change of the last turn persisted."""
    for rec in records.values():
        rec.stored_as, rec.dirty = (rec.status, rec.attempt), False
    return records


def finish_sent(records: dict[int, Record], output: Any = None) -> list[str]:
    """Complete every dispatched step still in flight, as its worker would; their names."""
    finished = []
    for rec in sorted(records.values(), key=lambda r: r.seq):
        if rec.kind == "step" and rec.status != COMPLETED and rec.enqueued_at is not None:
            rec.status, rec.output, rec.enqueued_at = COMPLETED, output, None
            finished.append(rec.name)
    return finished
