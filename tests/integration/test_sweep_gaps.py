"""The orphan sweep after a gap in its passes (the database or beat was away) spares the holds
and leases that lapsed in the gap for one pass: their holders could not renew either, and a live
one renews as soon as the database answers. A holder that stays silent is judged a pass later."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable import clock
from durable.engine import presence, sweeps
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db


@durable.step
def work(name):
    return name


@durable.workflow(name="tests.sweep_gaps.one")
def one(ctx, name):
    return ctx.step(work, name)


def _held_attempt(durable_env) -> str:
    """A run whose step attempt was taken by a process (held 30 s) that renews it no more."""
    run = durable.start(one, "a")
    durable_env.run_next()
    (message,) = [m for m in durable_env.pending() if m.task == "durable.run_step"]
    durable_env.drop("durable.run_step")
    run_id, seq, attempt, token = message.args
    now = clock.now()
    assert Checkpoint.objects.take(run_id, seq, attempt, token, "w/1", now, now + timedelta(seconds=30))
    return run.id


def test_a_hold_that_lapsed_while_the_orphan_sweep_did_not_pass_is_judged_one_pass_later(durable_env):
    run_id = _held_attempt(durable_env)
    presence.sweep_ran(sweeps.ORPHANS, 0)  # the last pass before the database went away
    durable_env.advance_time("40s")  # the hold lapsed 10 s ago, and no pass was noted since
    step = Checkpoint.objects.get(run_id=run_id, kind="step")
    assert (step.attempt, step.held_by) == (1, "w/1")  # spared: its holder may live
    presence.sweep_ran(sweeps.ORPHANS, 0)  # that pass, noted
    durable_env.advance_time("5s")  # the holder did not renew meanwhile: it is gone
    step = Checkpoint.objects.get(run_id=run_id, kind="step")
    assert (step.attempt, step.error["code"]) == (2, "worker_lost")


def test_a_hold_that_lapsed_between_regular_passes_is_judged_at_once(durable_env):
    run_id = _held_attempt(durable_env)
    durable_env.advance_time("25s")
    presence.sweep_ran(sweeps.ORPHANS, 0)
    durable_env.advance_time("6s")
    step = Checkpoint.objects.get(run_id=run_id, kind="step")
    assert (step.attempt, step.error["code"]) == (2, "worker_lost")
