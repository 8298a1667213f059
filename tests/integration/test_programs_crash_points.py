"""Workflow programs Hypothesis generates, each explored with one fault (the process killed at a
crash point, or a message lost, delivered twice or after the ones behind it), then with a
schedule of two or three such faults in one run (tests/crashpoints.py).

A program is a list of operations one interpreter workflow runs in order: steps of each kind
(local, through the broker, in place), a step that fails its first attempt, a sleep, a wait for a
signal, a wait for an update answered after a step, a fan, a child, and continue-as-new (then
the rest of the program runs in the next generation). Hypothesis draws the program, the fault
and where it strikes (a fraction of the fault-free run's points); a failure shrinks to a small
program and Hypothesis prints how to reproduce it. ``DURABLE_PROGRAMS`` sets how many programs
each test draws (CI: a fixed number; ``DURABLE_PROGRAMS=200 pytest -m crashpoints
tests/integration/test_programs_crash_points.py`` for a longer search).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durable
from tests.crashpoints import (
    DOUBLE,
    DROP,
    KILL,
    REORDER,
    Scenario,
    advance,
    deliver,
    effect,
    explore,
    explore_schedule,
)

pytestmark = [pytest.mark.crashpoints, pytest.mark.django_db(transaction=True)]

PROGRAMS = int(os.environ.get("DURABLE_PROGRAMS", "40"))
#: Programs run under a schedule of faults (each costs one faulted run, not one per point).
SCHEDULES = int(os.environ.get("DURABLE_PROGRAMS", "25"))


@durable.step(name="tests.programs.local", local=True)
def local_add(i):
    effect()
    return i + 1


@durable.step(name="tests.programs.add")
def add(i):
    effect()
    return i + 1


@durable.step(name="tests.programs.flaky", retry=durable.Retry(max_attempts=2, initial="1s"))
def flaky(i):
    effect()
    if durable.step_info().attempt == 1:
        raise RuntimeError("the first attempt fails")
    return i + 1


@durable.workflow(name="tests.programs.child")
def child(ctx, i):
    return ctx.step(add, i)


@durable.workflow(name="tests.programs.run")
def program_run(ctx, program):
    out = []
    for at, (op, arg) in enumerate(program):
        if op == "local":
            out.append(ctx.step(local_add, arg))
        elif op == "step":
            out.append(ctx.step(add, arg))
        elif op == "flaky":
            out.append(ctx.step(flaky, arg))
        elif op == "sleep":
            ctx.sleep("1s")
        elif op == "signal":
            out.append(ctx.wait_for_signal("go"))
        elif op == "update":
            update = ctx.wait_for_update("deposit")
            out.append(ctx.step(add, update.payload))
            ctx.reply(update, out[-1])
        elif op == "fan":
            out.append(ctx.map(add, list(range(arg))))
        elif op == "child":
            out.append(ctx.child(child, arg))
        elif op == "continue":
            ctx.continue_as_new(program[at + 1 :])
    return out


STEPS = st.one_of(
    st.tuples(st.sampled_from(["local", "step", "flaky", "child"]), st.integers(0, 9)),
    st.tuples(st.just("fan"), st.integers(1, 3)),
    st.tuples(st.just("sleep"), st.just(0)),
)
#: Signals and updates are sent to the newest run of the chain once its first turns ran: the
#: waits come after the last continue-as-new (a run's unconsumed messages stay with it).
PROGRAMS_OF = (
    st.tuples(
        st.lists(st.one_of(STEPS, st.tuples(st.just("continue"), st.just(0))), max_size=3),
        st.lists(st.one_of(STEPS, st.tuples(st.sampled_from(["signal", "update"]), st.just(0))), max_size=4),
    )
    .map(lambda parts: parts[0] + parts[1])
    .filter(bool)
)


def operations(program: list[tuple[str, int]]) -> list[str]:
    return [op for op, _ in program]


def scenario(program: list[tuple[str, int]], in_place: bool) -> Scenario:
    """The program's run, driven the way each of its waits needs: every signal and update it
    waits for is sent once the first turns ran, and the clock moves past each sleep and backoff."""
    ops = operations(program)

    def send(env: Any, run_id: str) -> None:
        for _ in range(ops.count("signal")):
            durable.signal(_newest(run_id), "go", 7)
        for i in range(ops.count("update")):
            durable.update(_newest(run_id), "deposit", i)

    actions: list[tuple[str, Any]] = [("worker", deliver)]
    for _ in range(ops.count("sleep") + ops.count("flaky") + 1):
        actions.append(("worker", advance("2s")))
    actions += [("client", send), ("worker", deliver)]
    for _ in range(ops.count("sleep") + ops.count("flaky") + 1):
        actions.append(("worker", advance("2s")))

    def prepare(env: Any) -> None:
        if in_place:
            env.transport.served_queues = {"durable"}

    return Scenario(
        f"program {program}{' in place' if in_place else ''}",
        lambda: durable.start(program_run, program).id,
        actions,
        prepare=prepare,
    )


def _newest(run_id: str) -> str:
    from durable.engine import runs

    return runs.follow(run_id).id


@settings(
    max_examples=PROGRAMS,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)
@given(
    program=PROGRAMS_OF,
    in_place=st.booleans(),
    fault=st.sampled_from([KILL, KILL, DROP, DOUBLE, REORDER]),
    where=st.floats(0, 1, exclude_max=True),
)
def test_a_generated_program_keeps_the_invariants_under_one_fault(
    durable_env, program, in_place, fault, where
):
    def strike(points: int) -> list[int]:
        return [1 + int(where * points)] if points else []

    report = explore(durable_env, scenario(program, in_place), fault=fault, choose=strike)
    print(f"program {program} in_place={in_place} {fault} at {where:.2f}: {report}")


#: A fault and where it strikes: a fraction of the fault-free run's points of its kind (every
#: point for a kill, message receipts for the others), counted from the fault before it.
FAULTS = st.tuples(st.sampled_from([KILL, KILL, DROP, DOUBLE, REORDER]), st.floats(0, 1, exclude_max=True))


@settings(
    max_examples=SCHEDULES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)
@given(program=PROGRAMS_OF, in_place=st.booleans(), schedule=st.lists(FAULTS, min_size=2, max_size=3))
def test_a_generated_program_keeps_the_invariants_under_up_to_three_faults(
    durable_env, program, in_place, schedule
):
    report = explore_schedule(durable_env, scenario(program, in_place), schedule)
    print(f"program {program} in_place={in_place} {schedule}: {report}")
