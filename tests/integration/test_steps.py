"""Steps through durable_env: dispatched and local steps, retries, timeouts and heartbeats."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable import ApplicationError, Retry
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

LEDGER: list[tuple[str, int]] = []


@pytest.fixture(autouse=True)
def _clear_ledger():
    LEDGER.clear()


@durable.step
def double(n: int) -> int:
    LEDGER.append(("double", n))
    return n * 2


@durable.step(local=True)
def local_inc(n: int) -> tuple[int, int]:
    LEDGER.append(("local_inc", n))
    return (n, n + 1)


@durable.step(retry=Retry(max_attempts=3, initial="10s", backoff=2.0, maximum="1m"))
def flaky(n: int) -> int:
    info = durable.step_info()
    LEDGER.append(("flaky", info.attempt))
    if info.attempt < 3:
        raise ConnectionError(f"attempt {info.attempt} failed")
    return n


@durable.step(retry=Retry(max_attempts=5, non_retryable=(KeyError,)))
def never_retry(kind: str) -> None:
    LEDGER.append(("never_retry", durable.step_info().attempt))
    if kind == "key":
        raise KeyError("missing")
    raise ApplicationError("card declined", code="declined", details={"psp": "x"}, non_retryable=True)


@durable.step(retry=Retry(max_attempts=2, initial="1s"), timeout="30s")
def slow() -> str:
    return "done"


@durable.step(heartbeat_timeout="20s", retry=Retry(max_attempts=1))
def beating(n: int) -> int:
    for i in range(n):
        durable.heartbeat(progress={"i": i})
    return n


@durable.workflow(name="tests.steps_dispatched")
def dispatched_flow(ctx, n):
    return [ctx.step(double, n), ctx.step(double, n + 1)]


@durable.workflow(name="tests.steps_local")
def local_flow(ctx, n):
    return ctx.step(local_inc, n)


@durable.workflow(name="tests.steps_flaky")
def flaky_flow(ctx, n):
    return ctx.step(flaky, n)


@durable.workflow(name="tests.steps_never")
def never_flow(ctx, kind):
    return ctx.step(never_retry, kind)


@durable.workflow(name="tests.steps_caught")
def caught_flow(ctx, kind):
    try:
        ctx.step(never_retry, kind)
    except durable.StepFailed as exc:
        return {"caught": exc.message, "code": exc.code}


@durable.workflow(name="tests.steps_slow")
def slow_flow(ctx, _):
    return ctx.step(slow)


@durable.workflow(name="tests.steps_beating")
def beating_flow(ctx, n):
    return ctx.step(beating, n)


def test_dispatched_steps_run_in_order_and_record_once(durable_env):
    run = durable.start(dispatched_flow, 5)
    durable_env.run_until_idle()
    assert durable.result(run.id) == [10, 12]
    assert LEDGER == [("double", 5), ("double", 6)]
    rows = list(
        Checkpoint.objects.filter(run_id=run.id).values_list("seq", "kind", "name", "status", "attempt")
    )
    assert rows == [(0, "step", double.name, "completed", 1), (1, "step", double.name, "completed", 1)]


def test_dispatched_step_is_a_celery_message_on_its_queue(durable_env):
    run = durable.start(dispatched_flow, 1)
    pending = durable_env.pending()
    assert [(m.task, m.args, m.queue) for m in pending] == [("durable.advance", (run.id,), "durable")]
    durable_env.run_next()
    step_messages = [m for m in durable_env.pending() if m.task == "durable.run_step"]
    token = Checkpoint.objects.get(run_id=run.id, seq=0).token
    assert len(token) >= 32  # unguessable: only this message may start the attempt
    assert [(m.args, m.queue) for m in step_messages] == [((run.id, 0, 1, token), "durable")]


def test_local_step_runs_inside_the_turn_and_returns_its_typed_output(durable_env):
    run = durable.start(local_flow, 1)
    ran = durable_env.run_until_idle()
    assert ran == 1  # one turn, no step message
    assert durable.result(run.id) == (1, 2)
    assert Checkpoint.objects.get(run_id=run.id).status == "completed"


def test_retry_waits_on_a_durable_timer_with_backoff(durable_env):
    run = durable.start(flaky_flow, 7)
    durable_env.run_until_idle()
    row = Checkpoint.objects.get(run_id=run.id)
    assert (row.status, row.attempt, row.enqueued_at) == ("pending", 2, None)
    assert row.error["message"] == "attempt 1 failed"
    delay = row.wake_at - durable_env.now()
    assert timedelta(seconds=10) <= delay <= timedelta(seconds=12)
    assert durable_env.pending() == []  # no Celery ETA: the wait lives in the database
    durable_env.advance_time("9s")
    assert LEDGER == [("flaky", 1)]
    durable_env.advance_time("3s")
    assert LEDGER == [("flaky", 1), ("flaky", 2)]
    durable_env.advance_time("25s")
    assert durable.result(run.id) == 7
    assert [a for _, a in LEDGER] == [1, 2, 3]


def test_retries_exhausted_fail_the_run_with_the_step_error(durable_env):
    @durable.step(name="tests.steps_always_fails", retry=Retry(max_attempts=2, initial="1s"))
    def always_fails():
        raise ValueError("nope")

    @durable.workflow(name="tests.steps_always_fails_flow")
    def flow(ctx, _):
        return ctx.step(always_fails)

    run = durable.start(flow)
    durable_env.run_until_idle()
    durable_env.advance_time("2s")
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert record.error["type"] == "StepFailed"
    assert record.error["message"] == "nope"
    assert Checkpoint.objects.get(run_id=run.id).attempt == 2


def test_non_retryable_error_fails_at_once_with_code_and_details(durable_env):
    run = durable.start(never_flow, "declined")
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert (record.error["code"], record.error["details"]) == ("declined", {"psp": "x"})
    assert LEDGER == [("never_retry", 1)]
    with pytest.raises(durable.RunFailed) as failure:
        durable.result(run.id)
    assert failure.value.code == "declined"


def test_non_retryable_exception_class_fails_at_once(durable_env):
    run = durable.start(never_flow, "key")
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "failed"
    assert LEDGER == [("never_retry", 1)]


def test_body_can_catch_a_failed_step(durable_env):
    run = durable.start(caught_flow, "declined")
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"caught": "card declined", "code": "declined"}


def test_step_timeout_is_enforced_by_durable_not_sent_as_a_celery_time_limit(durable_env):
    durable.start(slow_flow)
    durable_env.run_next()
    (message,) = durable_env.pending()
    assert "soft_time_limit" not in message.options and "time_limit" not in message.options


def test_step_that_never_reports_times_out_and_is_retried(durable_env):
    run = durable.start(slow_flow)
    durable_env.run_next()
    (message,) = durable_env.pending()
    durable_env.drop()  # the worker took it and died: no result ever comes
    Checkpoint.objects.filter(run_id=run.id).update(started_at=durable_env.now())
    durable_env.advance_time("40s")
    row = Checkpoint.objects.get(run_id=run.id)
    assert row.attempt == 2
    assert row.error["type"] == "StepTimeout"
    durable_env.advance_time("2s")  # the retry's backoff
    assert durable.result(run.id) == "done"


def test_heartbeat_persists_progress_throttled_and_keeps_the_last(durable_env):
    run = durable.start(beating_flow, 4)
    durable_env.run_until_idle()
    row = Checkpoint.objects.get(run_id=run.id)
    assert durable.result(run.id) == 4
    assert row.progress == {"i": 3}
    assert row.last_heartbeat_at is not None


def test_silent_step_past_heartbeat_timeout_fails(durable_env):
    run = durable.start(beating_flow, 1)
    durable_env.run_next()
    durable_env.drop()
    Checkpoint.objects.filter(run_id=run.id).update(started_at=durable_env.now())
    durable_env.advance_time("20.5s")
    assert durable.get_run(run.id).status == "suspended"  # within timeout + its grace (1 s)
    durable_env.advance_time("1s")
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert Checkpoint.objects.get(run_id=run.id).error["type"] == "StepTimeout"


def test_step_info_idempotency_key_is_stable_across_attempts(durable_env):
    keys = []

    @durable.step(name="tests.steps_keyed", retry=Retry(max_attempts=3, initial="1s"))
    def keyed():
        info = durable.step_info()
        keys.append(info.idempotency_key)
        if info.attempt < 2:
            raise RuntimeError("again")
        return info.attempt

    @durable.workflow(name="tests.steps_keyed_flow")
    def flow(ctx, _):
        return ctx.step(keyed)

    run = durable.start(flow)
    durable_env.run_until_idle()
    durable_env.advance_time("5s")
    assert durable.result(run.id) == 2
    assert keys == [f"{run.id}:0", f"{run.id}:0"]


def test_calling_a_step_outside_a_workflow_just_calls_it():
    assert double(4) == 8
    durable.heartbeat()  # a no-op outside durable


def test_step_info_outside_a_step_says_where_it_works():
    with pytest.raises(durable.DurableError, match="only inside a step"):
        durable.step_info()
