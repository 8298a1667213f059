"""Payloads in messages to and from remote workers under a codec (API.md §10): a remote step's
arguments, result and progress, and a remote turn's input, history, signals and decision travel
sealed as the rows hold them; a reply no key opens is refused with ``payload_undecodable``; with
no codec the messages are what they always were; a Celery task cannot be a step under a codec."""

from __future__ import annotations

import json
import logging

import jsonschema
import pytest
from celery import Celery, shared_task
from cryptography.fernet import Fernet as FernetKeys
from django.conf import settings
from django.test import override_settings
from referencing import Registry, Resource

import durable
from durable import codecs, dispatch, protocol, remote
from durable.engine import decisions, results_by_message
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

KEY_A, KEY_B = FernetKeys.generate_key().decode(), FernetKeys.generate_key().decode()
#: A string every payload of these workflows carries; no message may show it.
MARKER = "Okapi-Narwhal-4417"
STEPS, TURNS = "rcodec-steps", "rcodec-turns"
NAMES = ("envelope", "record", "turn", "decision", "step_result", "heartbeat")
REGISTRY = Registry().with_resources(
    (protocol.schema(name)["$id"], Resource.from_contents(protocol.schema(name))) for name in NAMES
)


def under(*keys: str):
    codec = ["durable.codecs.Zlib", "durable.codecs.Fernet"]
    return override_settings(DURABLE={**settings.DURABLE, "CODEC": codec, "CODEC_KEYS": list(keys)})


def _validate(instance, name):
    jsonschema.Draft202012Validator(protocol.schema(name), registry=REGISTRY).validate(instance)


def _text(message: dispatch.Message) -> str:
    """Everything ``message`` would put on the broker, as text."""
    return json.dumps([message.task, message.args, message.queue, message.options], default=repr)


def _holding(text: str, messages: list[dispatch.Message]) -> list[str]:
    return [f"{m.task}: {_text(m)}" for m in messages if text in _text(m)]


def _run_all(durable_env) -> list[dispatch.Message]:
    """Run every pending message and what it sends; return them all, in the order they ran."""
    ran = []
    while (message := durable_env.run_next()) is not None:
        ran.append(message)
    return ran


@durable.step(name="tests.rcodec.label", remote=True, queue=STEPS)
def label(text, suffix=""):
    durable.heartbeat(progress={"seen": text})
    return {"label": f"{text}{suffix}"}


@durable.workflow(name="tests.rcodec.step_flow")
def step_flow(ctx, given):
    return ctx.step(label, given["note"], suffix="!")


@durable.step(name="tests.rcodec.echo")
def echo(value):
    return {"echo": value}


@durable.workflow(name="tests.rcodec.child")
def child_flow(ctx, note):
    return ctx.step(echo, note)


@durable.workflow(name="tests.rcodec.turns", remote=True, queue=TURNS)
def turn_flow(ctx, given):
    echoed = ctx.step(echo, given["note"])
    ctx.expose("seen", {"note": given["note"]})
    said = ctx.wait_for_signal("go")
    kid = ctx.child(child_flow, f"child {given['note']}")
    return {"echoed": echoed, "said": said, "child": kid}


@shared_task(name="tests.rcodec.celery_add")
def celery_add(a, b=0):
    return a + b


@durable.workflow(name="tests.rcodec.celery_flow")
def celery_flow(ctx, n):
    return ctx.step(celery_add, n, b=1)


# -- remote steps ------------------------------------------------------------------------------


def test_no_message_of_a_remote_step_under_a_codec_holds_its_payloads(durable_env):
    with under(KEY_A):
        run = durable.start(step_flow, {"note": MARKER})
        sent = _run_all(durable_env)
        assert durable.result(run.id) == {"label": f"{MARKER}!"}
        assert Checkpoint.objects.get(run_id=run.id).progress == {"seen": MARKER}
    (step,) = [m for m in sent if m.task == "tests.rcodec.label"]
    assert codecs.is_sealed(step.args[0]) and codecs.is_sealed(step.options["kwargs"]["suffix"])
    _validate(step.args[0], "envelope")
    assert _holding(MARKER, sent) == []


def test_durable_remote_opens_the_arguments_and_seals_the_result_and_progress(durable_env):
    app = Celery("remote-side", set_as_current=False)
    remote.serve(app)
    with under(KEY_A):
        run = durable.start(step_flow, {"note": MARKER})
        durable_env.run_next()
        (message,) = durable_env.drop("tests.rcodec.label")
        output = (
            app.tasks["tests.rcodec.label"]
            .apply(args=message.args, kwargs=message.options["kwargs"], headers=message.options["headers"])
            .get()
        )
        # The link sends this to durable.step_result; the beat left as a message of its own.
        assert codecs.is_sealed(output) and MARKER not in json.dumps(output)
        (beat,) = durable_env.pending()
        assert beat.task == dispatch.HEARTBEAT and _holding(MARKER, [beat]) == []
        _validate(beat.options["kwargs"], "heartbeat")
        row = Checkpoint.objects.get(run_id=run.id)
        report = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token, "output": output}
        _validate(report, "step_result")
        assert results_by_message.step_result(**report) == "completed"
        durable_env.run_until_idle()
        assert durable.result(run.id) == {"label": f"{MARKER}!"}
        assert Checkpoint.objects.get(pk=row.pk).progress == {"seen": MARKER}


def test_a_remote_worker_without_the_key_reports_a_failed_attempt(durable_env):
    app = Celery("remote-side", set_as_current=False)
    remote.serve(app)
    with under(KEY_A):
        durable.start(step_flow, {"note": MARKER})
        durable_env.run_next()
        (message,) = durable_env.drop("tests.rcodec.label")
    with under(KEY_B):
        failed = app.tasks["tests.rcodec.label"].apply(
            args=message.args, kwargs=message.options["kwargs"], headers=message.options["headers"]
        )
    assert failed.result.durable_error["code"] == "payload_undecodable"


def test_a_result_no_key_opens_is_refused_and_the_attempt_stays_open(durable_env, caplog):
    with under(KEY_A):
        run = durable.start(step_flow, {"note": MARKER})
        durable_env.run_next()
        durable_env.drop("tests.rcodec.label")
        row = Checkpoint.objects.get(run_id=run.id)
        where = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token}
        foreign = codecs.seal({"label": "forged"}, codecs.build([codecs.Fernet], [KEY_B]))
        with caplog.at_level(logging.WARNING, logger="durable.engine"):
            assert results_by_message.step_result(output=foreign, **where) == "stale"
        assert "payload_undecodable" in caplog.text
        assert not results_by_message.heartbeat(progress=foreign, **where)
        still = Checkpoint.objects.get(pk=row.pk)
        assert (still.status, still.attempt, still.output) == ("pending", 1, None)
        sealed = codecs.seal({"label": "right"}, codecs.build([codecs.Zlib, codecs.Fernet], [KEY_A]))
        assert results_by_message.step_result(output=sealed, **where) == "completed"
        durable_env.run_until_idle()
        assert durable.result(run.id) == {"label": "right"}


def test_a_remote_step_without_a_codec_is_sent_and_answered_in_plain_json(durable_env):
    durable.start(step_flow, {"note": MARKER})
    durable_env.run_next()
    (message,) = durable_env.drop("tests.rcodec.label")
    assert message.args == (MARKER,) and message.options["kwargs"] == {"suffix": "!"}
    app = Celery("remote-side", set_as_current=False)
    remote.serve(app)
    output = (
        app.tasks["tests.rcodec.label"]
        .apply(args=message.args, kwargs=message.options["kwargs"], headers=message.options["headers"])
        .get()
    )
    assert output == {"label": f"{MARKER}!"}
    assert durable_env.pending()[0].options["kwargs"]["progress"] == {"seen": MARKER}


# -- remote turns ------------------------------------------------------------------------------


def test_no_message_of_a_remote_turn_under_a_codec_holds_its_payloads(durable_env):
    with under(KEY_A):
        run = durable.start(turn_flow, {"note": MARKER})
        sent = _run_all(durable_env)
        assert durable.query(run.id, "seen") == {"note": MARKER}
        durable.signal(run.id, "go", {"card": MARKER})
        sent += _run_all(durable_env)
        assert durable.result(run.id) == {
            "echoed": {"echo": MARKER},
            "said": {"card": MARKER},
            "child": {"echo": f"child {MARKER}"},
        }
    turns = [m.options["kwargs"]["turn"] for m in sent if m.task == dispatch.REMOTE_TURN]
    decisions = [m.options["kwargs"] for m in sent if m.task == dispatch.DECISION]
    assert len(turns) >= 3 and len(decisions) == len(turns)
    for turn in turns:
        _validate(turn, "turn")
        assert codecs.is_sealed(turn["run"]["input"]) and turn["limits"]["sealed_payloads"] is True
    last = turns[-1]
    assert {rec["name"] for rec in last["records"]} >= {"tests.rcodec.echo", "go"}
    for decision in decisions:
        _validate(decision, "decision")
    assert codecs.is_sealed(decisions[-1]["output"])
    assert any(child["input"] for d in decisions for child in d["children"])
    assert _holding(MARKER, sent) == []


def test_a_decision_no_key_opens_is_refused_and_the_turn_keeps_its_lease(durable_env, caplog):
    with under(KEY_A):
        run = durable.start(turn_flow, {"note": MARKER})
        durable_env.run_next()  # the claim, which sends the turn
        (turn,) = durable_env.drop(dispatch.REMOTE_TURN)
        durable_env._handler(dispatch.REMOTE_TURN)(**turn.options["kwargs"])
        (decision,) = durable_env.drop(dispatch.DECISION)
    owner = turn.options["kwargs"]["turn"]["turn"]
    with under(KEY_B), caplog.at_level(logging.WARNING, logger="durable.engine"):
        assert decisions.apply(decision.options["kwargs"]) == "refused"
    assert "payload_undecodable" in caplog.text
    assert Run.objects.filter(id=run.id).values_list("locked_by", flat=True).get() == owner
    assert not Checkpoint.objects.filter(run_id=run.id).exists()
    with under(KEY_A):
        assert decisions.apply(decision.options["kwargs"]) == "suspended"


def test_a_remote_worker_without_the_key_drops_the_turn(durable_env):
    with under(KEY_A):
        durable.start(turn_flow, {"note": MARKER})
        durable_env.run_next()
        (turn,) = durable_env.drop(dispatch.REMOTE_TURN)
    with under(KEY_B):
        assert remote.run_turn(turn.options["kwargs"]["turn"]) == "undecodable"
    assert durable_env.pending() == []  # no decision: the lease lapses and the turn is sent again


def test_a_remote_turn_without_a_codec_carries_plain_json(durable_env):
    run = durable.start(turn_flow, {"note": MARKER})
    durable_env.run_next()
    (turn,) = durable_env.drop(dispatch.REMOTE_TURN)
    message = turn.options["kwargs"]["turn"]
    assert message["run"]["input"] == {"note": MARKER}
    assert "sealed_payloads" not in message["limits"]
    durable_env._handler(dispatch.REMOTE_TURN)(turn=message)
    (decision,) = durable_env.drop(dispatch.DECISION)
    (record,) = decision.options["kwargs"]["records"]
    assert record["input"] == {"args": [MARKER], "kwargs": {}}
    assert decisions.apply(decision.options["kwargs"]) == "suspended"
    assert Checkpoint.objects.get(run_id=run.id).input == {"args": [MARKER], "kwargs": {}}


# -- Celery tasks used as steps ------------------------------------------------------------------


def test_a_celery_task_used_as_a_step_is_refused_under_a_codec_before_anything_is_sent(durable_env):
    with under(KEY_A):
        run = durable.start(celery_flow, 1)
        sent = _run_all(durable_env)
        failed = Run.objects.get(id=run.id)
    assert failed.status == "failed" and failed.error["code"] == "plain_task_under_codec"
    assert "durable.remote" in failed.error["message"] and "CODEC" in failed.error["message"]
    assert not Checkpoint.objects.filter(run_id=run.id, kind="step").exists()
    assert [m for m in sent if m.task == "tests.rcodec.celery_add"] == []
