"""End to end: on a real worker, a step whose result is not JSON fails with the same code whether
it ran local, in place (no timeout: the turn runs it) or as a message (a timeout: Celery's)."""

from __future__ import annotations

import pytest

import durable
from durable.models import Checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class Opaque:
    """Not JSON."""


@durable.step(name="tests.e2e_codes.local", local=True)
def local_opaque():
    return Opaque()


@durable.step(name="tests.e2e_codes.in_place")
def in_place_opaque():
    return Opaque()


@durable.step(name="tests.e2e_codes.dispatched", timeout="30s")
def dispatched_opaque():
    return Opaque()


@durable.workflow(name="tests.e2e_codes.one_step")
def one_step(ctx, name):
    return ctx.step(name)


def test_a_non_json_step_result_is_invalid_output_on_every_path(durable_worker):
    runs = {
        name: durable.start(one_step, f"tests.e2e_codes.{name}")
        for name in ("local", "in_place", "dispatched")
    }
    codes = {}
    for name, run in runs.items():
        with pytest.raises(durable.RunFailed):
            durable.result(run.id, timeout=60)
        step = Checkpoint.objects.get(run_id=run.id, seq=0)
        codes[name] = (step.status, step.attempt, step.error["code"])
    assert codes == {name: ("failed", 1, "invalid_output") for name in runs}
