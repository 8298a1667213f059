"""A remote step served by a Python worker that has durable installed and no database reachable.

That worker (started with a DATABASE_URL nobody listens on) consumes only the step's queue:
durable registers the step as a Celery task there, runs its body, sends its heartbeats as
messages, and its result and failure travel back by message to durable's own worker.
"""

from __future__ import annotations

import os

import pytest

import durable
from durable.models import Checkpoint
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

QUEUE = "py-remote"
NO_DATABASE = {
    "DATABASE_URL": "postgres://nobody@127.0.0.1:9/nowhere",  # nothing listens on port 9
    "DURABLE_TEST_DATABASE_NAME": "",
    "PY_REMOTE_MARK": "no-database",
}


@durable.step(name="tests.py_remote_square", remote=True, queue=QUEUE, retry=durable.Retry(max_attempts=3))
def py_remote_square(x):
    durable.heartbeat({"x": x})
    if x < 0:
        raise durable.ApplicationError("negative", code="negative", non_retryable=True)
    return {"square": x * x, "where": os.environ.get("PY_REMOTE_MARK")}


@durable.workflow(name="tests.py_remote_flow")
def py_remote_flow(ctx, x):
    square = ctx.step(py_remote_square, x)
    try:
        ctx.step(py_remote_square, -x)
    except durable.StepFailed as exc:
        return {"square": square, "failed": exc.code}


def test_a_worker_with_durable_and_no_database_runs_remote_steps(durable_worker):
    durable_worker.add_worker(NO_DATABASE, name="no-database", queues=[QUEUE])
    run = durable.start(py_remote_flow, 7)
    result = durable.result(run.id, timeout=60)
    assert result == {"square": {"square": 49, "where": "no-database"}, "failed": "negative"}
    second = Checkpoint.objects.get(run_id=run.id, seq=1)
    assert second.attempt == 1  # non_retryable crossed over with the error
    # The beat and the result are two messages: the beat may be applied after the result.
    first = Checkpoint.objects.filter(run_id=run.id, seq=0)
    try:
        wait_for(lambda: first.get().progress == {"x": 7}, timeout=30, what="the step's beat")
    except AssertionError:
        print(durable_worker.logs()[-6000:])  # which beat was applied, refused or never came
        raise
