"""A child's position and the child run are written together: a turn that records a started
child in a mid-turn flush and then dies before its settle leaves no position without its run."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run

pytestmark = pytest.mark.django_db

stolen: list[str] = []


@durable.step(local=True)
def note(value: str) -> str:
    return value


@durable.step(local=True)
def lose_the_lease(run_id: str) -> str:
    """Another worker takes the run over while this turn runs (once)."""
    if not stolen:
        stolen.append(run_id)
        Run.objects.filter(id=run_id).update(locked_by="another-worker/abc")
    return "ok"


@durable.workflow(name="tests.child_pos.child")
def child(ctx: durable.Context, n: int) -> int:
    return n * 10


@durable.workflow(name="tests.child_pos.parent")
def parent(ctx: durable.Context, _: object) -> str:
    child_id = ctx.start_child(child, 4)
    ctx.step(note, "flushes the child's position")
    ctx.step(lose_the_lease, ctx.run_id)  # this turn dies here, before its settle
    return child_id


def test_a_child_recorded_in_a_flush_exists_even_if_its_turn_dies_before_settling(durable_env):
    stolen.clear()
    run = durable.start(parent)
    durable_env.run_until_idle()
    assert stolen == [run.id]
    child_ids = list(Run.objects.filter(parent_id=run.id).values_list("id", flat=True))
    assert len(child_ids) == 1  # created with the flush that recorded its position
    Run.objects.filter(id=run.id).update(locked_by=None, locked_until=None, status="suspended")
    durable_env.advance_time("10m")
    assert durable.result(run.id) == child_ids[0]
    assert durable.result(child_ids[0]) == 40
