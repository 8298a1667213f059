"""The remote protocol's JSON Schemas (durable/protocol/v1/) hold for what durable sends and takes."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import jsonschema
import pytest
from celery import current_app
from kombu import Exchange, Queue
from referencing import Registry, Resource

import durable
from durable import dispatch, protocol
from durable.engine import results_by_message
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

NAMES = ("attempt", "step_message", "step_result", "heartbeat")
REGISTRY = Registry().with_resources(
    (protocol.schema(name)["$id"], Resource.from_contents(protocol.schema(name))) for name in NAMES
)
QUEUE = "protocol-check"


def _validate(instance, name):
    jsonschema.Draft202012Validator(protocol.schema(name), registry=REGISTRY).validate(instance)


def _reference_worker():
    path = Path(__file__).resolve().parents[2] / "examples" / "remote_worker" / "remote_worker.py"
    spec = importlib.util.spec_from_file_location("remote_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@durable.step(name="tests.protocol_shout", remote=True, queue=QUEUE, timeout="30s")
def protocol_shout(text, loud=True):
    return text.upper()


@durable.workflow(name="tests.protocol_flow")
def protocol_flow(ctx, text):
    return ctx.step(protocol_shout, text, loud=True)


def _sent_on_the_wire(message):
    """Publish ``message`` as durable does, then read it back raw from the broker."""
    with current_app.connection_for_write() as connection:
        queue = Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE)(connection.default_channel)
        queue.declare()
        queue.purge()
        dispatch.celery_sender(message)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            raw = queue.get(no_ack=True)
            if raw is not None:
                return {"headers": raw.headers, "body": raw.decode()}
            time.sleep(0.1)
    raise AssertionError("the message never reached the broker")


def test_every_schema_is_a_valid_draft_2020_12_schema():
    for name in NAMES:
        jsonschema.Draft202012Validator.check_schema(protocol.schema(name))
    assert protocol.schema("attempt")["properties"]["protocol"]["const"] == dispatch.PROTOCOL


def test_a_remote_step_on_the_wire_fits_the_step_message_schema(durable_env):
    run = durable.start(protocol_flow, "hi")
    durable_env.run_next()
    (message,) = durable_env.drop("tests.protocol_shout")
    wire = _sent_on_the_wire(message)
    _validate(wire, "step_message")
    assert wire["body"][:2] == [["hi"], {"loud": True}]
    attempt = wire["headers"]["durable_attempt"]
    assert attempt["run_id"] == run.id and attempt["timeout"] == 30.0
    assert attempt["token"] == Checkpoint.objects.get(run_id=run.id, seq=0).token


def test_the_reports_of_the_reference_worker_fit_the_schemas_and_are_recorded(durable_env):
    worker_module = _reference_worker()
    run = durable.start(protocol_flow, "hi")
    durable_env.run_next()
    (message,) = durable_env.drop("tests.protocol_shout")
    header = message.options["headers"]["durable_attempt"]
    _validate(header, "attempt")
    worker = worker_module.RemoteWorker("memory://", QUEUE)
    attempt = worker_module.Attempt(worker, header)
    beat = {**attempt.report(), "progress": {"done": 1}}
    _validate(beat, "heartbeat")
    assert results_by_message.heartbeat(**beat) is True
    failed = worker.result_message(attempt, error=ValueError("x"))
    _validate(failed, "step_result")
    done = worker.result_message(attempt, output="HI")
    _validate(done, "step_result")
    assert results_by_message.step_result(**done) == "completed"
    assert (
        results_by_message.step_result(**failed) == "stale"
    )  # the attempt is settled: a late report changes nothing
    durable_env.run_until_idle()
    assert durable.result(run.id) == "HI"


def test_a_report_without_its_token_fits_no_schema_and_is_dropped(durable_env):
    run = durable.start(protocol_flow, "hi")
    durable_env.run_next()
    report = {"run_id": run.id, "seq": 0, "attempt": 1, "output": "forged"}
    with pytest.raises(jsonschema.ValidationError, match="token"):
        _validate(report, "step_result")
    assert results_by_message.step_result(**report) == "stale"
