"""Exceptions whose ``__str__`` or ``__repr__`` raise end a run or a step as failed, with their type.

Describing the error must not itself raise: the turn would crash at every try until the run went
``dead`` (max_recovery_attempts), hiding the body's own failure.
"""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("__str__ is broken")


class BadRepr(Exception):
    def __str__(self):
        raise RuntimeError("__str__ is broken")

    def __repr__(self):
        raise RuntimeError("__repr__ is broken")


KINDS = {"BadStr": BadStr, "BadRepr": BadRepr}


@durable.step(name="tests.unprintable_step", retry=durable.Retry(max_attempts=2, initial="1s"))
def unprintable_step(kind):
    raise KINDS[kind]()


@durable.workflow(name="tests.unprintable_body")
def unprintable_body(ctx, kind):
    raise KINDS[kind]()


@durable.workflow(name="tests.unprintable_step_flow")
def unprintable_step_flow(ctx, kind):
    return ctx.step(unprintable_step, kind)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_body_exception_that_cannot_be_shown_fails_the_run_with_its_type(durable_env, kind):
    run_id = durable.start(unprintable_body, kind).id
    durable_env.run_until_idle()
    run = Run.objects.get(id=run_id)
    assert run.status == "failed", (run.status, run.error)
    assert run.error["type"] == kind and kind in run.error["message"]
    assert run.recovery_attempts == 0


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_step_exception_that_cannot_be_shown_fails_the_step_with_its_type(durable_env, kind):
    run_id = durable.start(unprintable_step_flow, kind).id
    durable_env.run_until_idle()
    durable_env.advance_time("5s")
    run = Run.objects.get(id=run_id)
    assert run.status == "failed", (run.status, run.error)
    step = Checkpoint.objects.get(run_id=run_id, seq=0)
    assert (step.status, step.attempt, step.error["type"]) == ("failed", 2, kind)
    assert run.recovery_attempts == 0
