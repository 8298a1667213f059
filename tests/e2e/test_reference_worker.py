"""The reference remote worker (examples/remote_worker/, kombu only, no Django, no Celery) completes
a workflow's remote steps, reporting results and heartbeats as protocol v1 messages; under a
codec it opens and seals their payloads, and no raw broker message holds them."""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography.fernet import Fernet as FernetKeys
from django.conf import settings
from django.test import override_settings

import durable
from durable import codecs
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


KEY = FernetKeys.generate_key().decode()
CODEC = ["durable.codecs.Zlib", "durable.codecs.Fernet"]
#: A string the run's payloads carry; no raw broker message may show it.
MARKER = "Tapir-Axolotl-9052"
#: The durable workers' settings under that codec (as the environment their settings read).
SEALED = {"env": {**settings_env(SETTINGS), "DURABLE_CODEC": ",".join(CODEC), "DURABLE_CODEC_KEYS": KEY}}


@durable.workflow(name="tests.reference_worker_codec_flow")
def codec_flow(ctx, text):
    return {"loud": ctx.step(shout, text)}


def _waiting(client: redis.Redis) -> list[bytes]:
    """The raw messages kombu keeps in Redis for the step's queue (one list per priority)."""
    return [raw for key in client.keys(f"{QUEUE}*") for raw in client.lrange(key, 0, -1)]


def _bodies(raw_messages: list[bytes]) -> list[str]:
    """Each message's body as its worker reads it (kombu stores it base64-encoded)."""
    return [base64.b64decode(json.loads(raw)["body"]).decode() for raw in raw_messages]


@pytest.mark.parametrize("durable_worker_options", [SEALED])
def test_the_reference_worker_runs_a_sealed_remote_step_whose_waiting_message_holds_no_payload(
    durable_worker_options, durable_worker, redis_broker, postgres
):
    _purge([QUEUE])
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    with override_settings(DURABLE={**settings.DURABLE, "CODEC": CODEC, "CODEC_KEYS": [KEY]}):
        run = durable.start(codec_flow, f"psst {MARKER}")  # the durable worker sends the step
        waiting = wait_for(lambda: _waiting(client), timeout=60, what="the step's message in Redis")
        bodies = _bodies(waiting)
        assert not [raw for raw in waiting if MARKER.encode() in raw]
        assert not [body for body in bodies if MARKER in body]
        assert all(codecs.is_sealed(json.loads(body)[0][0]) for body in bodies)  # [args, kwargs, embed]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "DJANGO_", "DATABASE"))}
        env.update(DURABLE_CODEC_KEYS=KEY, DURABLE_CODEC_ZLIB="1")
        log = Path(tempfile.mkdtemp(prefix="reference-worker-")) / "worker.log"
        argv = [sys.executable, str(WORKER), settings.CELERY_BROKER_URL, QUEUE]
        worker = CeleryProcess(argv, env, log, "remote worker ready").start()
        try:
            assert durable.result(run.id, timeout=60) == {"loud": f"PSST {MARKER.upper()}"}
        finally:
            worker.stop()
