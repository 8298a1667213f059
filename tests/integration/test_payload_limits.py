"""MAX_PAYLOAD_BYTES holds for everything durable stores from a workflow or a step, not only for
what the API is given: a clear error naming what was too big, before anything is stored."""

from __future__ import annotations

import pytest
from django.test import override_settings

import durable
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

BIG = "x" * 2000
SMALL_LIMIT = override_settings(DURABLE={"MAX_PAYLOAD_BYTES": 1000})


@durable.step
def big_output_dispatched() -> str:
    return BIG


@durable.step(local=True)
def big_output_local() -> str:
    return BIG


@durable.step
def echo(value: str) -> str:
    return value


@durable.workflow(name="tests.payload.child")
def child(ctx: durable.Context, value: str) -> str:
    return value


@durable.workflow(name="tests.payload.flow")
def flow(ctx: durable.Context, what: str) -> object:
    try:
        if what == "output dispatched":
            return ctx.step(big_output_dispatched)
        if what == "output local":
            return ctx.step(big_output_local)
        if what == "step arguments":
            return ctx.step(echo, BIG)
        if what == "child input":
            return ctx.child(child, BIG)
        if what == "continue_as_new input":
            ctx.continue_as_new(BIG)
        if what == "search attributes":
            ctx.upsert_search_attributes({"note": BIG})
        if what == "workflow output":
            return BIG
    except (durable.StepFailed, durable.InvalidInput) as exc:
        return {"code": exc.code, "message": str(exc)}
    return "done"


def _run(durable_env, what: str) -> Run:
    with SMALL_LIMIT:
        run = durable.start(flow, what)
        durable_env.run_until_idle()
    return Run.objects.get(id=run.id)


@pytest.mark.parametrize("what", ["output dispatched", "output local"])
def test_a_step_output_over_the_limit_fails_the_step_and_names_it(durable_env, what):
    run = _run(durable_env, what)
    assert run.output["code"] == "invalid_output"
    assert "the output of step" in run.output["message"] and "MAX_PAYLOAD_BYTES" in run.output["message"]
    assert Checkpoint.objects.get(run=run, kind="step").output is None


@pytest.mark.parametrize(
    "what, named",
    [
        ("step arguments", "the arguments of step"),
        ("child input", "the input of child workflow"),
        ("continue_as_new input", "the input of continue_as_new()"),
        ("search attributes", "search attributes"),
    ],
)
def test_what_a_workflow_would_store_over_the_limit_is_refused_in_the_body(durable_env, what, named):
    run = _run(durable_env, what)
    assert run.output["code"] == "invalid_input"
    assert named in run.output["message"] and "MAX_PAYLOAD_BYTES" in run.output["message"]
    assert not Checkpoint.objects.filter(run=run).exists()  # nothing was recorded
    assert Run.objects.count() == 1  # no child, no successor


def test_a_workflow_output_over_the_limit_fails_the_run(durable_env):
    run = _run(durable_env, "workflow output")
    assert run.status == "failed" and run.error["code"] == "invalid_output"
    assert "the output of workflow" in run.error["message"]
