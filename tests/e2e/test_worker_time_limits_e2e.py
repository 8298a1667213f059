"""A worker started with ``--time-limit`` and ``--soft-time-limit``: durable sees the limits
Celery applies to its tasks, though those flags never reach the app's settings.

A turn runs a step in place only in a task no time limit would cut short (``EAGER_STEPS``): under
the worker's limits the step goes through the broker instead, as it does under the app's
``task_time_limit``, and a step can read the limit its task runs under.

The worker imports this module (``--include``), so the workflow is registered on both sides.
"""

from __future__ import annotations

import pytest
from celery import current_task

import durable
from durable import dispatch

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@durable.step(name="tests.worker_time_limits.seen")
def seen() -> list:
    return [dispatch.time_limit(), current_task.name]


@durable.workflow(name="tests.worker_time_limits.flow")
def flow(ctx, _):
    return ctx.step(seen)


@pytest.fixture
def durable_worker_options():
    return {"start": False}


def test_a_workers_own_time_limits_keep_steps_out_of_its_turns(durable_worker):
    durable_worker.primary.process.argv += ["--time-limit=300", "--soft-time-limit=240"]
    durable_worker.primary.start()
    run = durable.start(flow)
    limit, task = durable.result(run.id, timeout=60)
    assert limit == 240.0  # the soft one, the first to end a task
    assert task == dispatch.RUN_STEP  # its own task, not the turn's
