"""Standard Python types cross every durable boundary and come back typed: step arguments and
results, workflow input and output, signals, children, exposed values, on the first turn as on
every replay (API.md §10, Values)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from io import StringIO
from zoneinfo import ZoneInfo

import pydantic
import pytest
from django.core.management import call_command
from django.test import override_settings

import durable
from durable.models import Checkpoint, Run
from tests.typed_values import VALUES, typed

pytestmark = pytest.mark.django_db


#: (turn, what the body saw) of every turn, replays included.
seen: list[tuple[str, object]] = []
#: What the step function was called with.
called: list[object] = []


@pytest.fixture(autouse=True)
def _fresh():
    seen.clear()
    called.clear()


@durable.step(name="tests.values.echo")
def echo(value):
    called.append(value)
    return value


@durable.step(name="tests.values.echo_local", local=True)
def echo_local(value):
    called.append(value)
    return value


@durable.workflow(name="tests.values.through_steps")
def through_steps(ctx, given):
    seen.append(("input", given))
    dispatched = ctx.step(echo, given)
    seen.append(("dispatched", dispatched))
    local = ctx.step(echo_local, given)
    seen.append(("local", local))
    ctx.sleep("1m")  # a later turn replays all of the above from the history
    seen.append(("after sleep", dispatched))
    return {"dispatched": dispatched, "local": local}


@durable.workflow(name="tests.values.signals")
def signals(ctx, _):
    payload = ctx.wait_for_signal("paid")
    seen.append(("signal", payload))
    ctx.expose("paid", payload)
    return payload


@durable.workflow(name="tests.values.child")
def child(ctx, given):
    return {"child got": given}


@durable.workflow(name="tests.values.parent")
def parent(ctx, given):
    answer = ctx.child(child, given)
    seen.append(("child", answer))
    return answer


def test_steps_receive_and_return_typed_values_on_the_first_turn_and_every_replay(durable_env):
    run = durable.start(through_steps, VALUES)
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    assert durable.get_run(run.id).status == "completed"
    assert [typed(value) for value in called] == [typed(VALUES)] * 2
    turns = [label for label, _ in seen]
    assert turns.count("after sleep") == 1 and turns.count("input") >= 2  # at least one replay
    for label, value in seen:
        assert typed(value) == typed(VALUES), label
    assert typed(durable.result(run.id)) == typed({"dispatched": VALUES, "local": VALUES})


def test_rows_keep_tagged_json_a_query_can_read(durable_env):
    run = durable.start(through_steps, {"price": Decimal("12.34")})
    durable_env.run_until_idle()
    assert Run.objects.get(id=run.id).input == {"price": {"__durable__": "decimal", "v": "12.34"}}
    step = Checkpoint.objects.get(run_id=run.id, kind="step", name="tests.values.echo")
    assert step.output == {"price": {"__durable__": "decimal", "v": "12.34"}}


def test_a_signal_payload_and_an_exposed_value_come_back_typed(durable_env):
    run = durable.start(signals)
    durable_env.run_until_idle()
    durable.signal(run.id, "paid", VALUES)
    durable_env.run_until_idle()
    assert typed(durable.result(run.id)) == typed(VALUES)
    assert [typed(value) for _, value in seen] == [typed(VALUES)]
    assert typed(durable.query(run.id, "paid")) == typed(VALUES)


def test_a_child_receives_and_returns_typed_values(durable_env):
    run = durable.start(parent, VALUES)
    durable_env.run_until_idle()
    assert typed(durable.result(run.id)) == typed({"child got": VALUES})
    assert seen and all(typed(value) == typed({"child got": VALUES}) for _, value in seen)


def test_an_input_with_no_json_form_is_refused_naming_its_path_before_anything_is_stored(durable_env):
    with pytest.raises(durable.InvalidInput) as refused:
        durable.start(through_steps, {"order": {"items": [{"price": 1}, {"price": float("nan")}]}})
    assert "the input of workflow 'tests.values.through_steps' at order.items[1].price" in str(refused.value)
    assert not Run.objects.exists()


def test_a_naive_datetime_is_refused_under_use_tz_and_accepted_without_it(durable_env):
    naive = datetime(2026, 1, 1, 12, 0)
    with pytest.raises(durable.InvalidInput, match="at when is a naive datetime"):
        durable.start(through_steps, {"when": naive})
    with override_settings(USE_TZ=False):
        run = durable.start(through_steps, {"when": naive})
    assert Run.objects.get(id=run.id).input == {"when": {"__durable__": "datetime", "v": naive.isoformat()}}


def test_a_step_returning_a_model_instance_fails_its_run_saying_pass_the_pk(durable_env):
    @durable.step(name="tests.values.returns_a_run")
    def returns_a_run():
        return {"run": Run.objects.first()}

    @durable.workflow(name="tests.values.model_output")
    def model_output(ctx, _):
        return ctx.step(returns_a_run)

    run = durable.start(model_output)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed) as failed:
        durable.result(run.id)
    assert failed.value.code == "invalid_output"
    assert "at run is a Django model instance (Run); pass its pk" in failed.value.message


@durable.register_type
@dataclasses.dataclass(frozen=True)
class Receipt:
    number: uuid.UUID
    total: Decimal
    paid_at: datetime


@durable.step(name="tests.values.charge")
def charge(total: Decimal) -> Receipt:
    called.append(total)
    return Receipt(VALUES["id"], total, VALUES["at"])


@durable.workflow(name="tests.values.registered")
def registered(ctx, total):
    receipt = ctx.step(charge, total)
    seen.append(("receipt", receipt))
    ctx.sleep("1m")
    return receipt


def test_a_registered_dataclass_comes_back_as_itself_in_the_body_and_from_result(durable_env):
    run = durable.start(registered, Decimal("9.99"))
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    expected = Receipt(VALUES["id"], Decimal("9.99"), VALUES["at"])
    assert called == [Decimal("9.99")]
    assert len(seen) >= 2 and all(value == expected and type(value) is Receipt for _, value in seen)
    assert durable.result(run.id) == expected


@durable.workflow(name="tests.values.priced")
def priced(ctx, _):
    update = ctx.wait_for_update("price")
    seen.append(("update", update.payload))
    ctx.reply(update, {"was": update.payload, "set at": VALUES["at"]})
    return update.payload


@priced.validator("price")
def _a_price(payload):
    called.append(payload)
    if payload < 0:
        raise ValueError("a price is not negative")


def test_an_update_payload_reaches_its_validator_the_body_and_the_reply_typed(durable_env):
    run = durable.start(priced)
    durable_env.run_until_idle()
    with pytest.raises(durable.UpdateRejected, match="a price is not negative"):
        durable.update(run.id, "price", Decimal("-1"))
    durable.update(run.id, "price", Decimal("12.34"), idempotency_key="p")
    durable_env.run_until_idle()
    assert [typed(value) for value in called] == [typed(Decimal("-1")), typed(Decimal("12.34"))]
    assert [typed(value) for _, value in seen] == [typed(Decimal("12.34"))]
    reply = durable.update(run.id, "price", Decimal("12.34"), wait="5s", idempotency_key="p")
    assert typed(reply) == typed({"was": Decimal("12.34"), "set at": VALUES["at"]})


@durable.workflow(name="tests.values.per_customer", singleton=durable.Singleton(key="{customer}"))
def per_customer(ctx, job):
    return job["customer"]


@durable.step(name="tests.values.limited", concurrency=durable.Concurrency(limit=1, key="{day}"))
def limited(day: date) -> date:
    return day


@durable.workflow(name="tests.values.limited_flow")
def limited_flow(ctx, day):
    return ctx.step(limited, day)


def test_singleton_and_concurrency_keys_are_made_from_the_typed_values(durable_env):
    run = durable.start(per_customer, {"customer": VALUES["id"]})
    assert Run.objects.get(id=run.id).singleton_key == f"tests.values.per_customer:{VALUES['id']}"
    run = durable.start(limited_flow, date(2026, 12, 3))
    durable_env.run_until_idle()
    assert durable.result(run.id) == date(2026, 12, 3)
    from durable.engine.flow import slot_key

    step = Checkpoint.objects.get(run_id=run.id, kind="step")
    assert slot_key(limited, step.input) == "c:tests.values.limited:2026-12-03"


@durable.workflow(name="tests.values.failure_handler", input_schema=durable.Failure)
def failure_handler(ctx, failure):
    seen.append(("failure", failure.input))
    return failure.input


@durable.workflow(name="tests.values.fails", on_error={"*": failure_handler})
def fails(ctx, order):
    raise durable.ApplicationError("declined", code="declined")


def test_an_on_error_handler_receives_the_failed_runs_input_typed(durable_env):
    run = durable.start(fails, VALUES)
    durable_env.run_until_idle()
    assert typed(durable.result(f"on_error:{run.id}")) == typed(VALUES)
    assert seen and all(typed(value) == typed(VALUES) for _, value in seen)


@durable.workflow(name="tests.values.counts")
def counts(ctx, total):
    seen.append(("count", total))
    if total < Decimal("0.3"):
        ctx.continue_as_new(total + Decimal("0.1"))
    return total


@durable.workflow(name="tests.values.starts")
def starts(ctx, given):
    return ctx.start(child, given, run_id="started-by-values")


def test_continue_as_new_and_ctx_start_hand_on_typed_inputs(durable_env):
    run = durable.start(counts, Decimal("0.0"))
    durable_env.run_until_idle()
    assert durable.result(run.id) == Decimal("0.3") and str(durable.result(run.id)) == "0.3"
    assert all(type(value) is Decimal for _, value in seen)
    durable.start(starts, VALUES)
    durable_env.run_until_idle()
    assert typed(durable.result("started-by-values")) == typed({"child got": VALUES})


@durable.step(name="tests.values.paris_noon", local=True)
def paris_noon():
    return datetime(2026, 6, 1, 12, 0, tzinfo=ZoneInfo("Europe/Paris"))


@durable.workflow(name="tests.values.zoned")
def zoned(ctx, _):
    noon = ctx.step(paris_noon)
    seen.append(("noon", (noon, noon.utcoffset(), type(noon.tzinfo).__name__)))
    ctx.sleep("1m")
    return noon


def test_the_first_turn_sees_the_value_as_stored_not_the_object_the_step_returned(durable_env):
    run = durable.start(zoned)
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    assert durable.get_run(run.id).status == "completed"
    # A ZoneInfo is stored as its offset: the first turn and the replay both see the fixed offset.
    assert len(seen) == 2 and seen[0] == seen[1]
    assert seen[0][1] == (datetime(2026, 6, 1, 10, 0, tzinfo=UTC), timedelta(hours=2), "timezone")


def test_the_replay_check_passes_a_history_of_typed_values_on_the_code_that_wrote_it(durable_env):
    run = durable.start(through_steps, VALUES)
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    assert durable.get_run(run.id).status == "completed"
    called.clear()
    out = StringIO()
    call_command("durable", "replay", stdout=out)
    assert "0 would break" in out.getvalue()
    assert called == []  # the check runs no step


@dataclasses.dataclass(frozen=True)
class Invoice:
    """Not registered: the step's annotations name it."""

    total: Decimal
    lines: tuple[str, ...]


@durable.step(name="tests.values.invoice")
def invoice(total: Decimal) -> Invoice:
    return Invoice(total, ("a", "b"))


@durable.workflow(name="tests.values.invoiced")
def invoiced(ctx, total: Decimal) -> Invoice:
    made = ctx.step(invoice, total)
    seen.append(("invoice", made))
    ctx.sleep("1m")
    return made


def test_a_class_a_steps_annotation_names_comes_back_as_itself_with_no_registration(durable_env):
    run = durable.start(invoiced, Decimal("5.00"))
    durable_env.run_until_idle()
    durable_env.advance_time("2m")
    expected = Invoice(Decimal("5.00"), ("a", "b"))
    assert len(seen) == 2 and all(value == expected and type(value) is Invoice for _, value in seen)
    assert durable.result(run.id) == expected


class Order(pydantic.BaseModel):
    # At import: a model built under a test's frozen clock would keep freezegun's date class.
    id: int


def test_a_pydantic_input_is_refused_saying_model_dump_or_input_schema(durable_env):
    with pytest.raises(durable.InvalidInput) as refused:
        durable.start(through_steps, {"order": Order(id=1)})
    said = str(refused.value)
    assert "at order is a pydantic model (Order); pass .model_dump(mode='json') of it" in said
    assert "input_schema=Order" in said and "durable.register_type(Order)" in said
    assert not Run.objects.exists()


def test_a_tuple_input_comes_back_a_tuple_not_a_list(durable_env):
    run = durable.start(through_steps, {"pair": (1, (2, 3)), "list": [1, 2]})
    durable_env.run_until_idle()
    durable_env.advance_time("1m")
    durable_env.run_until_idle()
    expected = {"pair": (1, (2, 3)), "list": [1, 2]}
    assert durable.result(run.id) == {"dispatched": expected, "local": expected}
    assert type(durable.result(run.id)["local"]["pair"]) is tuple
    assert called == [expected, expected]
