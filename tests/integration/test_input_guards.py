"""Bad values given to a public call are refused with InvalidInput naming the field, before anything
is stored: NUL characters, lone surrogates, lengths, nesting, durations, tags, reserved run ids, sizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import durable
from durable.definitions import registry
from durable.guards import MAX_DEPTH
from durable.models import CronSchedule, Event, Run, Signal

pytestmark = pytest.mark.django_db

NUL = "a\x00b"
SURROGATE = "a\ud800b"
TWO_MB = "x" * (2 * 1024 * 1024)


@durable.workflow(name="tests.guards_echo")
def echo_flow(ctx: durable.Context, value: Any) -> Any:
    return value


@durable.workflow(name="tests.guards_wait")
def wait_flow(ctx: durable.Context, _: Any) -> Any:
    return ctx.wait_for_signal("go")


def nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def stored() -> tuple[int, int, int, int]:
    return Run.objects.count(), Signal.objects.count(), Event.objects.count(), CronSchedule.objects.count()


def refused(call: Callable[[], Any], field: str) -> durable.InvalidInput:
    """Assert ``call`` raises InvalidInput naming ``field`` and stores nothing."""
    before = stored()
    with pytest.raises(durable.InvalidInput) as caught:
        call()
    assert caught.value.details == {"field": field}
    assert field in str(caught.value)
    assert stored() == before
    return caught.value


@pytest.fixture
def waiting(durable_env: Any) -> str:
    run_id = durable.start(wait_flow).id
    durable_env.run_until_idle()
    return run_id


# -- start -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        (NUL, "NUL"),
        (SURROGATE, "surrogate"),
        ("r" * 256, "at most 255"),
        ("dlq:mine", "prefix durable keeps"),
        ("on_error:mine", "prefix durable keeps"),
        ("schedule:mine:2026", "prefix durable keeps"),
    ],
)
def test_start_refuses_bad_run_ids(durable_env: Any, run_id: str, says: str) -> None:
    error = refused(lambda: durable.start(echo_flow, 1, run_id=run_id), "run_id")
    assert says in str(error)
    assert durable_env.pending() == []


def test_a_run_id_as_long_as_its_column_is_accepted(durable_env: Any) -> None:
    assert durable.start(echo_flow, 1, run_id="r" * 255).id == "r" * 255


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"note": NUL}, "NUL"),
        ({NUL: "in a key"}, "NUL"),
        ([SURROGATE], "surrogate"),
        ({SURROGATE: 1}, "surrogate"),
        (nested(10_000), f"deeper than {MAX_DEPTH}"),
        (nested(MAX_DEPTH + 1), f"deeper than {MAX_DEPTH}"),
        (TWO_MB, "MAX_PAYLOAD_BYTES"),
    ],
)
def test_start_refuses_inputs_that_cannot_be_stored(durable_env: Any, value: Any, says: str) -> None:
    error = refused(lambda: durable.start(echo_flow, value), "the input of workflow 'tests.guards_echo'")
    assert says in str(error)


def test_inputs_as_deep_as_the_limit_and_escaped_backslashes_are_accepted(durable_env: Any) -> None:
    for value in (nested(MAX_DEPTH), {"path": "C:\\u0000\\x"}, {"emoji": "\U0001f600"}):
        run = durable.start(echo_flow, value)
        durable_env.run_until_idle()
        assert durable.result(run.id) == value


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        ({"tags": None}, "tags", "list of strings"),
        ({"tags": "vip"}, "tags", "list of strings"),
        ({"tags": [1]}, "tags", "only strings"),
        ({"tags": [NUL]}, "tags", "NUL"),
        ({"tags": [SURROGATE]}, "tags", "surrogate"),
        ({"namespace": NUL}, "namespace", "NUL"),
        ({"namespace": "n" * 101}, "namespace", "at most 100"),
        ({"delay": "999999999d"}, "delay", "too long"),
        ({"delay": 10**12}, "delay", "too long"),
    ],
)
def test_start_refuses_bad_options(durable_env: Any, kwargs: dict[str, Any], field: str, says: str) -> None:
    assert says in str(refused(lambda: durable.start(echo_flow, 1, **kwargs), field))


def test_start_refuses_a_workflow_name_with_nul(durable_env: Any) -> None:
    refused(lambda: durable.start(NUL, 1), "workflow")


def test_a_workflow_whose_name_does_not_fit_its_column_cannot_start(durable_env: Any) -> None:
    long_name = durable.workflow(lambda ctx, _: None, name="w" * 201)
    try:
        assert "longer than 200 characters" in str(refused(lambda: durable.start(long_name), "workflow"))
    finally:
        registry.workflows.pop(long_name.name)


# -- signals, updates, events ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda run_id: durable.signal(run_id, NUL, 1), "signal name"),
        (lambda run_id: durable.signal(run_id, "n" * 256, 1), "signal name"),
        (lambda run_id: durable.signal(run_id, "go", {"x": NUL}), "the payload of signal 'go'"),
        (lambda run_id: durable.signal(run_id, "go", TWO_MB), "the payload of signal 'go'"),
        (lambda run_id: durable.signal(run_id, "go", nested(10_000)), "the payload of signal 'go'"),
        (lambda run_id: durable.signal(run_id + NUL, "go", 1), "run_id"),
        (lambda run_id: durable.signal(run_id, "go", 1, idempotency_key=NUL), "idempotency_key"),
        (lambda run_id: durable.update(run_id, SURROGATE, 1), "update name"),
        (lambda run_id: durable.update(run_id, "go", [SURROGATE]), "the payload of update 'go'"),
        (lambda run_id: durable.update(run_id, "go", TWO_MB), "the payload of update 'go'"),
        (lambda run_id: durable.update(run_id, "go", 1, wait="soon"), "wait"),
        (lambda run_id: durable.update(run_id, "go", 1, idempotency_key="k" * 256), "idempotency_key"),
        (lambda run_id: durable.query(run_id, NUL), "name"),
        (lambda run_id: durable.query(run_id, "go", timeout=-1), "timeout"),
    ],
)
def test_signals_and_updates_refuse_what_cannot_be_stored(waiting: str, call: Any, field: str) -> None:
    refused(lambda: call(waiting), field)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"run_id": "dlq:cart"}, "run_id"),
        ({"run_id": "cart", "signal": NUL}, "signal name"),
        ({"run_id": "cart", "payload": SURROGATE}, "the payload of signal 'cart'"),
        ({"run_id": "cart", "payload": TWO_MB}, "the payload of signal 'cart'"),
    ],
)
def test_signal_with_start_refuses_bad_values(durable_env: Any, kwargs: dict[str, Any], field: str) -> None:
    arguments = {"signal": "cart", "payload": 1, **kwargs}
    refused(lambda: durable.signal_with_start(wait_flow, None, **arguments), field)


@pytest.mark.parametrize(
    ("name", "payload", "field"),
    [
        (NUL, 1, "event name"),
        ("e" * 256, 1, "event name"),
        ("paid", {"order": NUL}, "the payload of event 'paid'"),
        ("paid", {SURROGATE: 1}, "the payload of event 'paid'"),
        ("paid", TWO_MB, "the payload of event 'paid'"),
        ("paid", nested(10_000), "the payload of event 'paid'"),
    ],
)
def test_publish_event_refuses_bad_values(durable_env: Any, name: str, payload: Any, field: str) -> None:
    refused(lambda: durable.publish_event(name, payload), field)


# -- cancel and lookups -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "says"), [(TWO_MB, "MAX_PAYLOAD_BYTES"), (NUL, "NUL"), (SURROGATE, "surrogate")]
)
def test_cancel_refuses_a_reason_that_cannot_be_stored(waiting: str, reason: str, says: str) -> None:
    assert says in str(refused(lambda: durable.cancel(waiting, reason=reason), "reason"))
    assert durable.get_run(waiting).status == "suspended"


@pytest.mark.parametrize(
    "call",
    [
        durable.get_run,
        durable.result,
        durable.retry,
        durable.delete_run,
        durable.cancel,
        lambda run_id: durable.signal(run_id, "go"),
    ],
)
@pytest.mark.parametrize("run_id", [NUL, SURROGATE, "r" * 256, 7])
def test_lookups_refuse_run_ids_that_cannot_exist(durable_env: Any, call: Any, run_id: Any) -> None:
    refused(lambda: call(run_id), "run_id")


def test_runs_durable_starts_itself_may_carry_reserved_ids(durable_env: Any) -> None:
    durable.schedule("guards", echo_flow, cron="* * * * *", input="tick")
    handle = durable.trigger_schedule("guards")
    assert handle.id.startswith("schedule:guards:")
    durable_env.run_until_idle()
    assert durable.get_run(handle.id).status == "completed"  # and a lookup of a reserved id works


# -- schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "kwargs", "field"),
    [
        (NUL, {}, "schedule key"),
        ("k" * 201, {}, "schedule key"),
        ("nightly", {"input": TWO_MB}, "the schedule's input"),
        ("nightly", {"input": {"x": NUL}}, "the schedule's input"),
        ("nightly", {"cron": "0 0 * * *" + " " * 200}, "cron"),
    ],
)
def test_schedule_refuses_bad_values(durable_env: Any, key: str, kwargs: dict[str, Any], field: str) -> None:
    arguments = {"cron": "0 3 * * *", **kwargs}
    refused(lambda: durable.schedule(key, echo_flow, **arguments), field)
