"""The reference remote worker (examples/remote_worker/, kombu only, no Django, no Celery) completes
a workflow's remote steps, reporting results and heartbeats as protocol v1 messages."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

import durable
from durable.models import Checkpoint
from durable.processes import CeleryProcess
from durable.testing import _purge, settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SETTINGS = {"TIMER_SWEEP_INTERVAL": "0.5s"}


@pytest.fixture
def durable_worker_options():
    return {"env": settings_env(SETTINGS)}


QUEUE = "remote-example"
WORKER = Path(__file__).resolve().parents[2] / "examples" / "remote_worker" / "remote_worker.py"


@durable.step(
    name="examples.shout", remote=True, queue=QUEUE, retry=durable.Retry(max_attempts=2, initial="0.2s")
)
def shout(text):
    raise AssertionError("runs on the reference worker only")


@durable.step(name="examples.count_words", remote=True, queue=QUEUE, heartbeat_timeout="5s")
def count_words(lines):
    raise AssertionError("runs on the reference worker only")


@durable.workflow(name="tests.reference_worker_flow")
def reference_flow(ctx, lines):
    loud = ctx.map(shout, lines)
    words = ctx.step(count_words, lines)
    try:
        ctx.step(shout, "")
    except durable.StepFailed as exc:
        return {"loud": loud, "words": words, "refused": exc.message}


@pytest.fixture
def reference_worker(durable_worker, redis_broker, postgres) -> Iterator[CeleryProcess]:
    _purge([QUEUE])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "DJANGO_", "DATABASE"))}
    log = Path(tempfile.mkdtemp(prefix="reference-worker-")) / "worker.log"
    argv = [sys.executable, str(WORKER), settings.CELERY_BROKER_URL, QUEUE]
    process = CeleryProcess(argv, env, log, "remote worker ready").start()
    try:
        yield process
    finally:
        process.stop()


def test_the_reference_worker_completes_a_workflows_remote_steps(durable_worker, reference_worker):
    durable_worker.start_beat()  # the timer sweep sends the retry of the refused shout
    assert "no durable, no Celery, no Django settings or ORM" in reference_worker.log()
    run = durable.start(reference_flow, ["one two", "three"])
    result = durable.result(run.id, timeout=60)
    assert result == {"loud": ["ONE TWO", "THREE"], "words": 3, "refused": "nothing to shout"}
    counted = Checkpoint.objects.filter(run_id=run.id, name="examples.count_words")
    # The last beat and the result are two messages: the beat may be applied after the result.
    wait_for(lambda: counted.get().progress == {"done": 2}, timeout=10, what="the last beat")
    refused = Checkpoint.objects.filter(run_id=run.id, name="examples.shout").order_by("seq").last()
    assert refused.attempt == 2  # the step's retry policy ran a second attempt
