"""The public API through durable_env: start, signal, cancel, retry, result, get_run, delete_run."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings

import durable
from durable.models import Checkpoint, Run, Signal

pytestmark = pytest.mark.django_db

FAIL_UNTIL = {"attempts": 0}


@durable.step
def echo(value):
    return value


@durable.step(retry=durable.Retry(max_attempts=1))
def fragile(value):
    if FAIL_UNTIL["attempts"] > 0:
        FAIL_UNTIL["attempts"] -= 1
        raise RuntimeError("fragile broke")
    return value


@durable.workflow(name="tests.api_echo")
def echo_flow(ctx, value):
    return ctx.step(echo, value)


@durable.workflow(name="tests.api_versioned", version="9")
def versioned_9(ctx, _):
    return "9"


@durable.workflow(name="tests.api_versioned", version="10")
def versioned_10(ctx, _):
    return "10"


@durable.workflow(name="tests.api_wait")
def wait_flow(ctx, _):
    ctx.step(echo, "started")
    return ctx.wait_for_signal("go")


@durable.workflow(name="tests.api_fragile")
def fragile_flow(ctx, value):
    first = ctx.step(echo, value)
    return [first, ctx.step(fragile, value)]


def test_start_returns_a_handle_and_the_run_completes(durable_env):
    handle = durable.start(echo_flow, {"a": 1}, tags=["x"])
    assert isinstance(handle, durable.RunHandle)
    assert handle.status() == "pending"
    durable_env.run_until_idle()
    assert handle.result() == {"a": 1}
    run = durable.get_run(handle.id)
    assert (run.workflow, run.version, run.tags, run.input) == ("tests.api_echo", "1", ["x"], {"a": 1})
    assert run.started_at and run.finished_at and run.created_at <= run.finished_at


def test_runs_started_one_after_another_get_ids_in_that_order(durable_env):
    made = []
    for i in range(20):
        made.append(durable.start(echo_flow, i).id)
        durable_env.advance_time("1ms")  # the frozen clock moves as a real one would
    assert made == sorted(made)
    assert {uuid.UUID(hex=run_id).version for run_id in made} == {7}
    assert list(Run.objects.order_by("id").values_list("id", flat=True)) == made


def test_start_is_idempotent_by_run_id(durable_env):
    first = durable.start(echo_flow, 1, run_id="order-1")
    again = durable.start(echo_flow, 2, run_id="order-1", tags=["ignored"])
    assert first == again
    assert Run.objects.count() == 1
    assert durable.get_run("order-1").input == 1
    durable_env.run_until_idle()
    assert durable.result("order-1") == 1


def test_run_id_of_another_workflow_is_refused(durable_env):
    durable.start(echo_flow, 1, run_id="shared-id")
    with pytest.raises(durable.InvalidInput, match="already belongs to workflow 'tests.api_echo'"):
        durable.start(wait_flow, None, run_id="shared-id")


def test_start_by_name_takes_the_newest_version_numerically(durable_env):
    newest = durable.start("tests.api_versioned")
    pinned = durable.start("tests.api_versioned", version="9")
    by_object = versioned_9.start()
    durable_env.run_until_idle()
    assert [durable.result(h.id) for h in (newest, pinned, by_object)] == ["10", "9", "9"]


def test_start_inside_a_rolled_back_transaction_leaves_nothing(durable_env):
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.start(echo_flow, 1, run_id="rolled-back")
        raise RuntimeError("the view failed")
    assert not Run.objects.filter(id="rolled-back").exists()
    assert durable_env.pending() == []


def test_first_turn_is_sent_only_when_the_transaction_commits(durable_env):
    with transaction.atomic():
        durable.start(echo_flow, 1, run_id="committed")
        assert durable_env.pending() == []
    assert [m.args for m in durable_env.pending()] == [("committed",)]


def test_start_with_delay_waits_on_a_timer(durable_env):
    run = durable.start(echo_flow, 1, delay="10m")
    assert durable_env.pending() == []
    assert durable.get_run(run.id).wake_at == durable_env.now() + timedelta(minutes=10)
    durable_env.advance_time("9m")
    assert durable.get_run(run.id).status == "pending"
    durable_env.advance_time("1m")
    assert durable.result(run.id) == 1


def test_cancel_stops_a_waiting_run(durable_env):
    run = durable.start(wait_flow)
    durable_env.run_until_idle()
    assert durable.cancel(run.id, reason="customer changed their mind") is True
    record = durable.get_run(run.id)
    assert record.status == "cancelled"
    assert record.error == {
        "message": "customer changed their mind",
        "type": "Cancelled",
        "code": "cancelled",
        "details": None,
    }
    with pytest.raises(durable.RunCancelled):
        durable.result(run.id)


def test_cancel_of_a_finished_run_returns_false_and_changes_nothing(durable_env):
    run = durable.start(echo_flow, 1)
    durable_env.run_until_idle()
    assert durable.cancel(run.id) is False
    assert durable.get_run(run.id).status == "completed"


def test_step_result_after_cancel_is_ignored(durable_env):
    run = durable.start(wait_flow)
    durable_env.run_next()  # the turn dispatches the step
    durable.cancel(run.id)
    durable_env.run_until_idle()  # the step message arrives late
    assert durable.get_run(run.id).status == "cancelled"
    assert Checkpoint.objects.get(run_id=run.id).status == "pending"


def test_retry_gives_the_failure_a_fresh_attempt_and_replays_the_rest(durable_env):
    FAIL_UNTIL["attempts"] = 1
    run = durable.start(fragile_flow, "v")
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "failed"
    first_step = Checkpoint.objects.get(run_id=run.id, seq=0)
    durable.retry(run.id)
    assert durable.get_run(run.id).status == "pending"
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["v", "v"]
    assert Checkpoint.objects.get(run_id=run.id, seq=0).finished_at == first_step.finished_at


def test_a_fresh_attempt_leaves_the_positions_of_a_run_no_longer_ended_alone(durable_env):
    FAIL_UNTIL["attempts"] = 1
    run = durable.start(fragile_flow, "v")
    durable_env.run_until_idle()
    failed = durable.get_run(run.id).failed_seqs
    assert failed == [1]
    Run.objects.reopen(run.id, durable_env.now())  # a concurrent retry got there first
    Checkpoint.objects.reattempt(run.id, failed)
    assert Checkpoint.objects.get(run_id=run.id, seq=1).status == "failed"


def test_retry_of_a_completed_run_is_refused(durable_env):
    run = durable.start(echo_flow, 1)
    durable_env.run_until_idle()
    with pytest.raises(durable.DurableError, match="only a failed, dead or cancelled run"):
        durable.retry(run.id)


def test_retry_of_a_cancelled_run_continues_it(durable_env):
    run = durable.start(wait_flow)
    durable_env.run_until_idle()
    durable.cancel(run.id)
    durable.retry(run.id)
    durable_env.run_until_idle()
    durable.signal(run.id, "go", "now")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "now"


def test_result_under_durable_env_never_waits(durable_env):
    run = durable.start(wait_flow)
    with pytest.raises(durable.WaitTimeout, match="pending"):
        durable.result(run.id, timeout=60)


def test_delete_run_removes_its_rows_and_children(durable_env):
    run = durable.start(wait_flow)
    durable_env.run_until_idle()
    durable.signal(run.id, "other", 1)
    child = Run.objects.create(
        id="child-1",
        workflow="x",
        version="1",
        queue="durable",
        parent_id=run.id,
        created_at=durable_env.now(),
        updated_at=durable_env.now(),
    )
    Run.objects.create(
        id="grandchild-1",
        workflow="x",
        version="1",
        queue="durable",
        parent_id=child.id,
        created_at=durable_env.now(),
        updated_at=durable_env.now(),
    )
    assert durable.delete_run(run.id) == 3
    assert not Run.objects.exists() and not Checkpoint.objects.exists() and not Signal.objects.exists()


# -- bad input: a clear error naming the problem, nothing half-written ---------------------


def test_unregistered_workflow_name_is_refused(durable_env):
    with pytest.raises(durable.WorkflowNotRegistered, match="'tests.api_nope'"):
        durable.start("tests.api_nope", 1)
    assert not Run.objects.exists() and durable_env.pending() == []


def test_unknown_version_is_refused_with_the_known_ones(durable_env):
    with pytest.raises(durable.WorkflowNotRegistered, match=r"no version '3'.*9, 10"):
        durable.start("tests.api_versioned", version="3")


def test_non_json_input_is_refused_before_anything_is_stored(durable_env):
    with pytest.raises(
        durable.InvalidInput, match="at when is an instance of object, which has no JSON form"
    ):
        durable.start(echo_flow, {"when": object()})
    assert not Run.objects.exists() and durable_env.pending() == []


def test_oversized_input_is_refused(durable_env):
    with (
        override_settings(DURABLE={"MAX_PAYLOAD_BYTES": 100}),
        pytest.raises(durable.InvalidInput, match="MAX_PAYLOAD_BYTES"),
    ):
        durable.start(echo_flow, "x" * 200)
    assert not Run.objects.exists()


def test_unknown_run_id_is_refused_everywhere(durable_env):
    for call in (
        lambda: durable.signal("ghost", "go"),
        lambda: durable.cancel("ghost"),
        lambda: durable.retry("ghost"),
        lambda: durable.get_run("ghost"),
        lambda: durable.result("ghost"),
        lambda: durable.delete_run("ghost"),
    ):
        with pytest.raises(durable.RunNotFound, match="'ghost'"):
            call()
    assert not Signal.objects.exists()


def test_signal_to_a_finished_run_is_refused_and_not_stored(durable_env):
    run = durable.start(echo_flow, 1)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFinished, match="completed"):
        durable.signal(run.id, "go", 1)
    assert not Signal.objects.exists()


def test_non_json_signal_payload_is_refused(durable_env):
    run = durable.start(wait_flow)
    with pytest.raises(durable.InvalidInput, match="signal 'go'"):
        durable.signal(run.id, "go", {"ids": object()})
    assert not Signal.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delay": "soon"}, "not a duration"),
        ({"tags": "vip"}, "tags must be a list"),
        ({"run_id": ""}, "run_id must be a non-empty string"),
        ({"namespace": 3}, "namespace must be a string"),
    ],
)
def test_bad_start_options_are_refused(durable_env, kwargs, message):
    with pytest.raises(durable.InvalidInput, match=message):
        durable.start(echo_flow, 1, **kwargs)
    assert not Run.objects.exists()


def test_validate_input_refuses_a_start(durable_env):
    def positive(value):
        if value <= 0:
            raise ValueError("must be positive")

    @durable.workflow(name="tests.api_validated", validate_input=positive)
    def flow(ctx, value):
        return value

    with pytest.raises(durable.InvalidInput, match="must be positive"):
        durable.start(flow, -1)
    assert not Run.objects.exists()


@durable.workflow(name="tests.api.names_a_successor")
def names_a_successor(ctx, _):
    return {"continued_as": "no-such-run", "total": 3}  # the body's own data, not a chain


def test_a_result_shaped_like_a_continuation_is_the_run_s_own(durable_env):
    run = durable.start(names_a_successor)
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"continued_as": "no-such-run", "total": 3}
