"""``ctx.patched`` and ``ctx.deprecate_patch`` through the life of a change: a workflow's code
moves from the old branch, to ``patched()``, to ``deprecate_patch()``, to no call at all, while
runs recorded by each stage keep replaying."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db


@durable.step(name="tests.patches.old_way")
def old_way(order):
    return f"old {order}"


@durable.step(name="tests.patches.new_way")
def new_way(order):
    return f"new {order}"


def before(ctx, order):
    first = ctx.step(old_way, order)
    return [first, ctx.wait_for_signal("go")]


def patching(ctx, order):
    first = ctx.step(new_way, order) if ctx.patched("tests.new-way") else ctx.step(old_way, order)
    return [first, ctx.wait_for_signal("go")]


def deprecating(ctx, order):
    ctx.deprecate_patch("tests.new-way")
    first = ctx.step(new_way, order)
    return [first, ctx.wait_for_signal("go")]


def dropped(ctx, order):
    first = ctx.step(new_way, order)
    return [first, ctx.wait_for_signal("go")]


STAGES = {"before": before, "patching": patching, "deprecating": deprecating, "dropped": dropped}
code = ["before"]


@durable.workflow(name="tests.patches.flow")
def flow(ctx, order):
    """The deployed code: whichever stage the test has shipped."""
    return STAGES[code[0]](ctx, order)


def _ship(stage):
    code[0] = stage


def _started_under(stage, durable_env, order):
    _ship(stage)
    run = durable.start(flow, order)
    durable_env.run_until_idle()
    return run


def _finish(run, durable_env):
    durable.signal(run.id, "go", "went")
    durable_env.run_until_idle()
    return durable.result(run.id)


@pytest.fixture(autouse=True)
def _reset():
    yield
    _ship("before")


def test_patched_keeps_old_runs_on_the_old_branch_and_new_runs_on_the_new(durable_env):
    old = _started_under("before", durable_env, 1)
    new = _started_under("patching", durable_env, 2)
    assert _finish(old, durable_env) == ["old 1", "went"]
    assert _finish(new, durable_env) == ["new 2", "went"]
    assert list(Checkpoint.objects.filter(run_id=new.id).values_list("kind", flat=True)) == [
        "patch",
        "step",
        "signal",
    ]


@pytest.mark.parametrize("last", ["deprecating", "dropped"])
def test_a_workflow_that_drops_a_deprecated_patched_call_replays_old_and_new_histories(durable_env, last):
    with_marker = _started_under("patching", durable_env, 1)  # recorded the marker
    deprecated = _started_under("deprecating", durable_env, 2)  # recorded it too
    without = _started_under("dropped", durable_env, 3)  # recorded no marker
    _ship(last)
    assert _finish(with_marker, durable_env) == ["new 1", "went"]
    assert _finish(deprecated, durable_env) == ["new 2", "went"]
    assert _finish(without, durable_env) == ["new 3", "went"]


def test_code_still_on_patched_replays_a_history_recorded_by_deprecate_patch(durable_env):
    run = _started_under("deprecating", durable_env, 4)
    _ship("patching")  # a worker not yet upgraded replays the new run
    assert _finish(run, durable_env) == ["new 4", "went"]


def test_a_marker_never_hides_a_real_change_of_code(durable_env):
    run = _started_under("patching", durable_env, 5)

    _ship("before")  # the new branch was deleted instead of the old one: not deterministic
    durable.signal(run.id, "go", "went")
    durable_env.run_until_idle()
    parked = durable.get_run(run.id)  # blocked, waiting for code that replays its history
    assert (parked.status, parked.error["code"]) == ("suspended", "non_determinism")
