"""A message that names an attempt but carries no token (or an empty one) matches nothing.

Between two sends an attempt has no token (a retry's backoff, an attempt sent again later):
a message without one must not find it "equal", or anyone who can publish to the broker settles
a remote step, marks it started or burns its attempts.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import durable
from durable import celery as durable_celery
from durable import tasks
from durable.engine import results_by_message, steps
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

NO_TOKENS = [None, ""]


@durable.step(
    name="tests.tokenless_remote",
    remote=True,
    queue="gpu",
    retry=durable.Retry(max_attempts=3, initial="60s"),
)
def tokenless_remote(x):
    return x * 2


@durable.workflow(name="tests.tokenless_flow")
def tokenless_flow(ctx, x):
    return ctx.step(tokenless_remote, x)


def _in_backoff(durable_env) -> tuple[str, Checkpoint]:
    """A run whose remote step failed its first attempt and waits 60s to send the second."""
    run = durable.start(tokenless_flow, 2)
    durable_env.run_next()
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    durable_env.drop()
    failed = results_by_message.step_result(run.id, 0, 1, error={"message": "first try"}, token=row.token)
    assert failed == "failed"
    durable_env.run_until_idle()
    row.refresh_from_db()
    assert row.status == "pending" and row.attempt == 2 and row.token is None
    return run.id, row


@pytest.mark.parametrize("token", NO_TOKENS)
def test_a_result_without_a_token_does_not_settle_an_attempt_in_backoff(durable_env, token):
    run_id, row = _in_backoff(durable_env)
    assert results_by_message.step_result(run_id, 0, 2, output="FORGED", token=token) == "stale"
    durable_env.run_until_idle()
    assert Checkpoint.objects.get(pk=row.pk).status == "pending"
    assert Run.objects.get(id=run_id).status != "completed"
    durable_env.advance_time("2m")  # past the backoff: the real attempt 2 is sent and runs
    assert durable.result(run_id) == 4


@pytest.mark.parametrize("token", NO_TOKENS)
def test_a_failure_without_a_token_does_not_fail_an_attempt_in_backoff(durable_env, token):
    run_id, row = _in_backoff(durable_env)
    where = {"run_id": run_id, "seq": 0, "attempt": 2, "token": token}
    assert tasks.step_failed.apply(args=("x",), kwargs=where).get() == "stale"
    assert results_by_message.step_result(run_id, 0, 2, error={"message": "FORGED"}, token=token) == "stale"
    now = Checkpoint.objects.get(pk=row.pk)
    assert now.status == "pending" and now.attempt == 2 and now.error["message"] == "first try"


@pytest.mark.parametrize("token", NO_TOKENS)
def test_a_heartbeat_without_a_token_does_not_start_an_attempt_in_backoff(durable_env, token):
    run_id, row = _in_backoff(durable_env)
    assert results_by_message.heartbeat(run_id, 0, 2, progress={"forged": 1}, token=token) is False
    now = Checkpoint.objects.get(pk=row.pk)
    assert now.started_at is None and now.held_by is None and now.progress != {"forged": 1}


@pytest.mark.parametrize("header_tail", [[], [None], [""]])
def test_a_task_header_without_a_token_does_not_start_an_attempt(durable_env, header_tail):
    run_id, row = _in_backoff(durable_env)
    task = SimpleNamespace(request=SimpleNamespace(durable=[run_id, 0, 2, *header_tail]))
    for _ in range(2):  # twice would exhaust max_attempts=3 if each counted as a lost attempt
        durable_celery._mark_task_step_started(task=task)
        assert Checkpoint.objects.get(pk=row.pk).started_at is None
        durable_env.advance_time("6m")
    assert durable.result(run_id) == 4


def test_run_step_without_a_token_runs_nothing(durable_env):
    """Rows sent before attempts carried tokens have none: a message without one runs nothing."""
    run = durable.start(tokenless_flow, 2)
    durable_env.run_next()
    Checkpoint.objects.filter(run_id=run.id, seq=0).update(token=None)
    for token in NO_TOKENS:
        assert steps.run_step(run.id, 0, 1, token) == "stale"
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert row.started_at is None and row.status == "pending"
