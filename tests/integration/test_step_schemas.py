"""Step input_schema / output_schema: checked where the attempt runs, before it runs and before its
result is recorded; a refusal is not retried and names what did not fit."""

from __future__ import annotations

import pydantic
import pytest

import durable
from durable import Retry
from durable.errors import InvalidInput
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

CALLS: list[object] = []


class Order(pydantic.BaseModel):
    id: int
    cents: int


class Receipt(pydantic.BaseModel):
    order: int
    charged: int


def charge(order: Order) -> Receipt:
    CALLS.append(order)
    return Receipt(order=order.id, charged=order.cents)


def broken_receipt(order: Order) -> dict:
    CALLS.append(order)
    return {"order": order.id}  # no "charged"


RETRY = Retry(max_attempts=3, initial="1s")
STEPS = {
    (local, name): durable.step(
        fn,
        name=f"tests.schemas.{name}.{'local' if local else 'dispatched'}",
        local=local,
        retry=RETRY,
        input_schema=Order,
        output_schema=Receipt,
    )
    for local in (True, False)
    for name, fn in (("charge", charge), ("broken", broken_receipt))
}


@durable.workflow(name="tests.schemas.wf")
def schemas_wf(ctx: durable.Context, input: dict) -> object:
    step = STEPS[(input["local"], input["step"])]
    try:
        return ctx.step(step, input["order"])
    except durable.StepFailed as exc:
        return {"failed": exc.code, "message": str(exc)}


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()


def _run(durable_env, local: bool, step: str, order: object) -> tuple[object, Checkpoint]:
    run = durable.start(schemas_wf, {"local": local, "step": step, "order": order})
    durable_env.run_until_idle()
    return durable.result(run.id), Checkpoint.objects.get(run_id=run.id, kind="step")


@pytest.mark.parametrize("local", [True, False], ids=["local", "dispatched"])
def test_the_step_receives_its_model_and_the_history_keeps_the_input_as_sent(durable_env, local):
    output, position = _run(durable_env, local, "charge", {"id": 7, "cents": "250"})
    # The returned model, recorded as JSON, reaches the body as the step's annotation names it.
    assert output == Receipt(order=7, charged=250)
    assert [Order(id=7, cents=250)] == CALLS
    assert position.input == {"args": [{"id": 7, "cents": "250"}], "kwargs": {}}
    assert position.output == {"order": 7, "charged": 250}


@pytest.mark.parametrize("local", [True, False], ids=["local", "dispatched"])
def test_an_input_that_does_not_fit_fails_the_step_at_once_without_running_it(durable_env, local):
    output, position = _run(durable_env, local, "charge", {"id": 7})
    assert output["failed"] == "invalid_input"
    assert "the input of step" in output["message"] and "cents" in output["message"]
    assert CALLS == []  # never called
    assert position.attempt == 1 and position.status == "failed"  # not retried
    assert position.error["details"][0]["loc"] == ["cents"]


@pytest.mark.parametrize("local", [True, False], ids=["local", "dispatched"])
def test_an_output_that_does_not_fit_is_not_recorded_and_not_retried(durable_env, local):
    output, position = _run(durable_env, local, "broken", {"id": 7, "cents": 1})
    assert output["failed"] == "invalid_output"
    assert "the output of step" in output["message"] and "charged" in output["message"]
    assert len(CALLS) == 1 and position.attempt == 1 and position.output is None


def test_a_schema_without_model_validate_is_refused_at_declaration():
    with pytest.raises(InvalidInput, match="input_schema= of 'f' takes a pydantic model"):
        durable.step(_f, name="tests.schemas.bad1", input_schema=dict)
    with pytest.raises(InvalidInput, match="output_schema= of 'f' takes a pydantic model"):
        durable.step(_f, name="tests.schemas.bad2", output_schema="Receipt")


def test_input_schema_on_a_step_of_several_arguments_is_refused_at_declaration():
    def pay(order_id: int, cents: int) -> None: ...

    with pytest.raises(InvalidInput, match="validates the step's one argument, but it takes 2"):
        durable.step(pay, name="tests.schemas.bad3", input_schema=Order)


def _f(order: dict) -> dict:
    return order


_f.__name__ = "f"
