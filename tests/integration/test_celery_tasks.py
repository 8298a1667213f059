"""Existing Celery tasks used as steps, through durable_env."""

from __future__ import annotations

import time

import pytest
from celery import shared_task

import durable
from durable.engine import results_by_message
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db


@shared_task(name="tests.celery_add")
def celery_add(a, b=0):
    return a + b


@shared_task(name="tests.celery_boom")
def celery_boom():
    raise ValueError("the legacy task failed")


@durable.workflow(name="tests.celery_flow")
def celery_flow(ctx, n):
    by_object = ctx.step(celery_add, n, b=1)
    by_name = ctx.step("tests.celery_add", by_object, b=10)
    return [by_object, by_name]


@durable.workflow(name="tests.celery_failing_flow")
def celery_failing_flow(ctx, _):
    try:
        ctx.step(celery_boom)
    except durable.StepFailed as exc:
        return exc.message


def test_celery_task_object_and_name_run_as_steps(durable_env):
    run = durable.start(celery_flow, 1)
    durable_env.run_next()
    (message,) = durable_env.pending()
    assert message.task == "tests.celery_add"  # sent as the task itself, not wrapped
    assert message.options["kwargs"] == {"b": 1}
    assert message.options["link"]["task"] == "durable.step_result"
    durable_env.run_until_idle()
    assert durable.result(run.id) == [2, 12]
    assert list(Checkpoint.objects.filter(run_id=run.id).values_list("name", "status")) == [
        ("tests.celery_add", "completed"),
        ("tests.celery_add", "completed"),
    ]


def test_failed_celery_task_fails_the_step(durable_env):
    run = durable.start(celery_failing_flow)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "the legacy task failed"


def test_step_result_records_once_and_ignores_duplicates(durable_env):
    run = durable.start(celery_flow, 1)
    durable_env.run_next()
    durable_env.drop()
    token = Checkpoint.objects.get(run_id=run.id, seq=0).token
    assert (
        results_by_message.step_result(run.id, 0, 1, output=666) == "stale"
    )  # no token: not the link durable sent
    assert results_by_message.step_result(run.id, 0, 1, output=666, token="guessed") == "stale"
    assert results_by_message.step_result(run.id, 0, 1, output=2, token=token) == "completed"
    assert results_by_message.step_result(run.id, 0, 1, output=999, token=token) == "stale"
    assert Checkpoint.objects.get(run_id=run.id, seq=0).output == 2


def test_beats_taken_out_of_order_keep_the_progress_sent_last(durable_env):
    """Two pool processes may take an attempt's beats in either order, and its result between."""
    run = durable.start(celery_flow, 1)
    durable_env.run_next()
    durable_env.drop()
    token = Checkpoint.objects.get(run_id=run.id, seq=0).token
    sent = time.time()
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 2}, token=token, sent_at=sent + 2) is True
    assert (
        results_by_message.heartbeat(run.id, 0, 1, {"done": 1}, token=token, sent_at=sent + 1) is True
    )  # alive
    assert Checkpoint.objects.get(run_id=run.id, seq=0).progress == {"done": 2}
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 3}, token=token, sent_at=sent + 3) is True
    assert results_by_message.step_result(run.id, 0, 1, output=2, token=token) == "completed"
    # Beats taken after the result: the one sent before the last kept is not kept over it.
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 2.5}, token=token, sent_at=sent + 2.5) is False
    assert Checkpoint.objects.get(run_id=run.id, seq=0).progress == {"done": 3}
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 4}, token=token, sent_at=sent + 4) is False
    assert Checkpoint.objects.get(run_id=run.id, seq=0).progress == {"done": 4}


def test_heartbeat_task_records_progress(durable_env):
    run = durable.start(celery_flow, 1)
    durable_env.run_next()
    durable_env.drop()
    token = Checkpoint.objects.get(run_id=run.id, seq=0).token
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 666}) is False  # no token
    assert results_by_message.heartbeat(run.id, 0, 1, {"done": 3}, token=token) is True
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert row.progress == {"done": 3} and row.last_heartbeat_at is not None
