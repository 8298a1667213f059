"""Steps run by workers without durable: plain Celery tasks and remote steps, reported by messages."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from celery import shared_task
from django.test import override_settings

import durable
from durable import tasks
from durable.engine import results_by_message
from durable.errors import InvalidInput
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db


@shared_task(name="tests.remote_plain_add")
def plain_add(a, b=0):
    return a + b


@durable.workflow(name="tests.remote_plain_flow")
def plain_flow(ctx, n):
    try:
        return ctx.step(plain_add, n, b=1)
    except durable.StepFailed as exc:
        return {"failed": exc.code, "message": exc.message}


@durable.step(
    name="tests.remote_double",
    remote=True,
    queue="gpu",
    retry=durable.Retry(max_attempts=3, initial="1s", non_retryable=["Refused"]),
)
def remote_double(x):
    if x == "boom":
        raise ValueError("the remote side failed")
    if x == "refuse":
        raise type("Refused", (Exception,), {})("no")
    durable.heartbeat(progress={"x": x})
    return x * 2


@durable.step(name="tests.pooled_triple", queue="gpu-pool", heartbeat_timeout="1m")
def pooled_triple(x):
    return x * 3


@durable.workflow(name="tests.remote_flow")
def remote_flow(ctx, x):
    try:
        return ctx.step(remote_double, x)
    except durable.StepFailed as exc:
        return {"failed": exc.code, "type": exc.details, "message": exc.message}


@durable.workflow(name="tests.remote_pool_flow")
def remote_pool_flow(ctx, x):
    return ctx.step(pooled_triple, x)


def _sent(durable_env, task):
    (message,) = [m for m in durable_env.pending() if m.task == task]
    return message


def _first_turn(durable_env, workflow, arg):
    run = durable.start(workflow, arg)
    durable_env.run_next()
    return run, Checkpoint.objects.get(run_id=run.id, seq=0)


# -- plain Celery tasks on a worker without durable --------------------------------------------


def test_a_failure_reported_with_only_the_task_id_is_recorded(durable_env):
    # Celery 5.7 calls an errback it has not registered as errback(task_id, **kwargs).
    run, row = _first_turn(durable_env, plain_flow, 1)
    durable_env.drop()
    where = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token}
    assert tasks.step_failed.apply(args=("the-task-id",), kwargs=where).get() == "failed"
    durable_env.run_until_idle()
    result = durable.result(run.id)
    assert result["failed"] == "task_failed" and "the-task-id" in result["message"]


def test_a_failure_reported_in_place_keeps_the_exception(durable_env):
    run, row = _first_turn(durable_env, plain_flow, 1)
    durable_env.drop()
    where = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token}
    tasks.step_failed(None, ValueError("bad input"), None, **where)
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"failed": None, "message": "bad input"}


def test_a_forged_failure_changes_nothing(durable_env):
    run, row = _first_turn(durable_env, plain_flow, 1)
    durable_env.drop()
    forged = {"run_id": run.id, "seq": 0, "attempt": 1, "token": "guessed"}
    assert tasks.step_failed.apply(args=("x",), kwargs=forged).get() == "stale"
    assert Checkpoint.objects.get(pk=row.pk).status == "pending"


def test_a_heartbeat_message_marks_the_task_started_so_it_is_never_sent_again(durable_env):
    run, row = _first_turn(durable_env, plain_flow, 1)
    durable_env.drop()
    beat = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token}
    for _ in range(4):  # 12 minutes of a step that beats every 3, past STEP_REDISPATCH_AFTER (5m)
        assert results_by_message.heartbeat(progress={"done": 1}, **beat) is True
        durable_env.advance_time("3m")
        assert not [m for m in durable_env.pending() if m.task == plain_add.name]
    now = Checkpoint.objects.get(pk=row.pk)
    assert now.started_at is not None and now.token == row.token and now.progress == {"done": 1}
    assert results_by_message.step_result(output=5, **beat) == "completed"
    durable_env.run_until_idle()
    assert durable.result(run.id) == 5


def test_a_beat_whose_attempt_ends_while_it_is_applied_keeps_its_progress(durable_env, monkeypatch):
    """Two processes take a step's last beat and its result at once: the beat reads the attempt
    pending, the result commits, the beat's guarded write then matches nothing."""
    run, row = _first_turn(durable_env, plain_flow, 1)
    durable_env.drop()
    beat = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token}
    read = results_by_message._task_attempt

    def read_then_result_lands(*args):
        found = read(*args)
        monkeypatch.setattr(results_by_message, "_task_attempt", read)
        assert results_by_message.step_result(output=5, **beat) == "completed"  # the other process
        return found

    monkeypatch.setattr(results_by_message, "_task_attempt", read_then_result_lands)
    assert results_by_message.heartbeat(progress={"done": 9}, **beat) is False
    assert Checkpoint.objects.get(pk=row.pk).progress == {"done": 9}


def test_heartbeats_that_stop_count_the_attempt_lost(durable_env):
    run, row = _first_turn(durable_env, plain_flow, 1)
    durable_env.drop()
    results_by_message.heartbeat(run.id, 0, 1, token=row.token)
    durable_env.advance_time("6m")  # past the beat's window (STEP_REDISPATCH_AFTER)
    assert durable.result(run.id)["failed"] == "worker_lost"


# -- remote steps ---------------------------------------------------------------------------------


def test_a_remote_step_is_sent_under_its_name_with_its_input_and_where_to_reply(durable_env):
    run, row = _first_turn(durable_env, remote_flow, 21)
    message = _sent(durable_env, "tests.remote_double")
    assert message.queue == "gpu" and message.args == (21,)
    header = message.options["headers"]["durable_attempt"]
    assert header == {
        "protocol": 1,
        "run_id": run.id,
        "seq": 0,
        "attempt": 1,
        "token": row.token,
        "reply_to": "durable",
        "timeout": None,
    }
    assert message.options["link"]["task"] == "durable.step_result"
    assert message.options["link_error"]["task"] == "durable.step_failed"
    durable_env.run_until_idle()
    assert durable.result(run.id) == 42
    assert Checkpoint.objects.get(pk=row.pk).progress == {"x": 21}


def test_a_remote_step_failure_is_retried_by_the_step_policy(durable_env):
    run, row = _first_turn(durable_env, remote_flow, "boom")
    durable_env.run_next()  # the remote attempt fails
    assert Checkpoint.objects.get(pk=row.pk).attempt == 2
    durable_env.advance_time("10s")
    durable_env.advance_time("10s")
    result = durable.result(run.id)
    assert result["message"] == "the remote side failed"
    assert Checkpoint.objects.get(pk=row.pk).attempt == 3


def test_a_remote_failure_of_a_non_retryable_type_fails_at_once(durable_env):
    run, row = _first_turn(durable_env, remote_flow, "refuse")
    durable_env.run_until_idle()
    assert durable.result(run.id)["message"] == "no"
    assert Checkpoint.objects.get(pk=row.pk).attempt == 1


def test_a_duplicated_or_forged_remote_result_changes_nothing(durable_env):
    run, row = _first_turn(durable_env, remote_flow, 2)
    durable_env.drop()
    where = {"run_id": run.id, "seq": 0, "attempt": 1}
    assert results_by_message.step_result(output=666, token="guessed", **where) == "stale"
    assert results_by_message.step_result(output=666, **where) == "stale"
    assert results_by_message.step_result(output=4, token=row.token, **where) == "completed"
    assert results_by_message.step_result(output=999, token=row.token, **where) == "stale"
    assert results_by_message.step_result(error={"message": "late"}, token=row.token, **where) == "stale"
    durable_env.run_until_idle()
    assert durable.result(run.id) == 4


def test_a_remote_attempt_whose_beats_stop_is_retried(durable_env):
    run, row = _first_turn(durable_env, remote_flow, 3)
    durable_env.drop()
    results_by_message.heartbeat(run.id, 0, 1, token=row.token)
    durable_env.advance_time("6m")
    lost = Checkpoint.objects.get(pk=row.pk)
    assert lost.attempt == 2 and lost.error["code"] == "worker_lost"
    durable_env.advance_time("2s")  # past the backoff: attempt 2 is sent, and runs
    assert durable.result(run.id) == 6


@override_settings(DURABLE={"REMOTE_QUEUES": ["gpu-pool"]})
def test_a_step_on_a_remote_queue_is_a_remote_step(durable_env):
    run, row = _first_turn(durable_env, remote_pool_flow, 5)
    assert row.input.get("remote") is True
    message = _sent(durable_env, "tests.pooled_triple")
    assert message.queue == "gpu-pool" and message.options["headers"]["durable_attempt"]["seq"] == 0
    durable_env.run_until_idle()
    assert durable.result(run.id) == 15


def test_a_durable_step_result_sent_as_a_message_is_refused(durable_env):
    run, row = _first_turn(durable_env, remote_pool_flow, 5)  # not remote: REMOTE_QUEUES unset
    assert not row.input.get("remote")
    assert results_by_message.step_result(run.id, 0, 1, output=1, token=row.token) == "stale"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"local": True}, "pick one"),
        ({"concurrency": 2}, "concurrency="),
        ({"rate_limit": "1/s"}, "rate_limit="),
        ({"queue": None}, "name the queue"),
    ],
)
def test_remote_options_that_cannot_be_kept_are_refused(options, says):
    with pytest.raises(InvalidInput, match=says):
        durable.step(remote=True, **{"queue": "gpu", **options})(lambda x: x)


def test_remote_queues_must_be_a_list_of_names():
    from durable import conf

    assert conf.problems({"REMOTE_QUEUES": "gpu"})[0][0] == "REMOTE_QUEUES"
    assert conf.problems({"REMOTE_QUEUES": ["gpu"]}) == []


def test_a_beat_window_covers_a_long_heartbeat_timeout():
    from durable import conf

    settings = conf.get()
    assert results_by_message._beat_window(pooled_triple.name, settings) == timedelta(minutes=5)
    assert results_by_message._beat_window("unknown", settings) == settings.STEP_REDISPATCH_AFTER


@durable.step(name="tests.remote_pool_limited", queue="gpu-limited", concurrency=2)
def remote_pool_limited(x):
    return x


def test_a_limited_step_on_a_remote_queue_is_reported_by_the_checks():
    from durable.checks import check_remote_queues

    assert check_remote_queues() == []
    with override_settings(DURABLE={"REMOTE_QUEUES": ["gpu-limited"]}):
        (error,) = check_remote_queues()
    assert error.id == "durable.E004" and "concurrency" in error.msg


UNDONE = []


@durable.step(name="tests.remote_reserve", remote=True, queue="gpu")
def remote_reserve(item):
    return f"reservation-{item}"


@remote_reserve.compensation
def release(reservation, item):
    UNDONE.append(reservation)


@durable.workflow(name="tests.remote_saga")
def remote_saga(ctx, item):
    ctx.step(remote_reserve, item)
    raise durable.ApplicationError("declined", code="declined")


def test_the_compensation_of_a_remote_step_is_sent_to_its_remote_worker(durable_env):
    UNDONE.clear()
    run = durable.start(remote_saga, "a")
    durable_env.run_next()
    durable_env.run_next()  # the remote step runs, the next turn fails the body: its undo is sent
    message = _sent(durable_env, "compensate:tests.remote_reserve")
    assert message.queue == "gpu" and message.args == ("reservation-a", "a")
    assert "durable_attempt" in message.options["headers"]
    durable_env.run_until_idle()
    assert UNDONE == ["reservation-a"]
    with pytest.raises(durable.RunFailed):
        durable.result(run.id)


def test_a_namespaced_run_asks_for_reports_on_its_namespace_queue(durable_env):
    run = durable.start(remote_flow, 4, namespace="tenant-a")
    durable_env.run_next()
    message = _sent(durable_env, "tests.remote_double")
    assert message.queue == "gpu.tenant-a"
    assert message.options["headers"]["durable_attempt"]["reply_to"] == "durable.tenant-a"
    assert message.options["link"]["options"]["queue"] == "durable.tenant-a"
    durable_env.run_until_idle()
    assert durable.result(run.id) == 8


@shared_task(name="tests.remote_beating_task")
def beating_task(n):
    durable.heartbeat({"n": n})
    return n


@durable.workflow(name="tests.remote_beating_flow")
def beating_flow(ctx, n):
    return ctx.step(beating_task, n)


def test_durable_heartbeat_in_a_celery_task_sent_as_a_step_goes_as_a_message(durable_env):
    run, row = _first_turn(durable_env, beating_flow, 3)
    (message,) = durable_env.drop("tests.remote_beating_task")
    # As a worker with durable installed but no database runs it: the beat leaves as a message.
    beating_task.apply(args=message.args, headers=message.options["headers"])
    (beat,) = durable_env.pending()
    assert beat.task == "durable.heartbeat" and beat.queue == "durable"
    sent_at = beat.options["kwargs"].pop("sent_at")  # the last beat sent is kept, taken in any order
    assert abs(sent_at - time.time()) < 60
    assert beat.options["kwargs"] == {
        "run_id": run.id,
        "seq": 0,
        "attempt": 1,
        "token": row.token,
        "progress": {"n": 3},
    }
    durable_env.run_next()
    assert Checkpoint.objects.get(pk=row.pk).started_at is not None


def test_durable_heartbeat_outside_any_step_does_nothing(durable_env):
    durable.heartbeat({"n": 1})
    beating_task(2)  # a plain call: no attempt, no message
    assert durable_env.pending() == []


def test_a_failure_reported_in_place_with_the_attempt_header_is_forwarded_as_a_message(durable_env):
    # A worker that has durable installed but maybe no database: the failure travels by message.
    run, row = _first_turn(durable_env, plain_flow, 1)
    (message,) = durable_env.drop("tests.remote_plain_add")
    request = type("Request", (), {"durable_attempt": message.options["headers"]["durable_attempt"]})()
    where = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token}
    assert tasks.step_failed(request, ValueError("bad input"), None, **where) == "forwarded"
    assert Checkpoint.objects.get(pk=row.pk).status == "pending"
    (report,) = durable_env.pending()
    assert report.task == "durable.step_result" and report.queue == "durable"
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"failed": None, "message": "bad input"}


def test_a_python_worker_serves_its_remote_steps_as_celery_tasks(durable_env):
    import pickle

    from celery import Celery

    from durable import remote

    app = Celery("remote-side", set_as_current=False)
    assert "tests.remote_double" in remote.serve(app)
    run, row = _first_turn(durable_env, remote_flow, 5)
    (message,) = durable_env.drop("tests.remote_double")
    headers = message.options["headers"]
    assert app.tasks["tests.remote_double"].apply(args=(5,), headers=headers).get() == 10
    assert durable_env.pending()[0].options["kwargs"]["progress"] == {"x": 5}  # its beat, as a message
    failed = app.tasks["tests.remote_double"].apply(args=("refuse",), headers=headers)
    error = pickle.loads(pickle.dumps(failed.result)).durable_error
    assert (error["type"], error["message"], error["non_retryable"]) == ("Refused", "no", True)
    unsent = app.tasks["tests.remote_double"].apply(args=(5,))
    assert unsent.result.durable_error["code"] == "invalid_input"


def test_progress_that_arrives_after_the_result_is_kept(durable_env):
    run, row = _first_turn(durable_env, remote_flow, 2)
    durable_env.drop()
    where = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token}
    assert results_by_message.step_result(output=4, **where) == "completed"
    assert (
        results_by_message.heartbeat(progress={"done": "all"}, **where) is False
    )  # too late to keep it alive
    assert results_by_message.heartbeat(progress={"forged": 1}, **{**where, "token": "guessed"}) is False
    assert Checkpoint.objects.get(pk=row.pk).progress == {"done": "all"}
