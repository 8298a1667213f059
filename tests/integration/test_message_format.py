"""durable's messages are JSON whatever the project's Celery serializer: a project that pickles
its own tasks still sends durable's as JSON, which a worker of any language can read."""

from __future__ import annotations

import json

import pytest
from celery import Celery, current_app

from durable import dispatch
from durable.celery import beat_schedule


def test_a_durable_message_is_json_even_when_the_project_pickles_its_tasks() -> None:
    app = Celery("pickler", broker="memory://", set_as_current=False)
    app.conf.task_serializer = "pickle"
    app.conf.accept_content = ["json", "pickle"]
    previous = current_app._get_current_object()
    app.set_current()
    try:
        with app.connection_for_write() as conn:
            queue = conn.SimpleQueue("durable-format-check")  # a queue no other test uses
            try:
                dispatch.celery_sender(dispatch.Message(dispatch.ADVANCE, ("run-1",), "durable-format-check"))
                message = queue.get(timeout=2)
                assert message.content_type == "application/json"
                assert json.loads(message.body)[0] == ["run-1"]
                message.ack()
            finally:
                queue.close()
    finally:
        previous.set_current()


def test_beat_sends_the_sweeps_as_json() -> None:
    assert {entry["options"]["serializer"] for entry in beat_schedule().values()} == {"json"}


def _received(app, queue_name: str, count: int) -> list:
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(queue_name)
        try:
            got = [queue.get(timeout=5) for _ in range(count)]
            for message in got:
                message.ack()
            return got
        finally:
            queue.close()


def _shape(message):
    """What a message says beyond its id, its task and its arguments."""
    varying = {"id", "root_id", "correlation_id", "delivery_tag", "argsrepr", "task"}
    headers = {k: v for k, v in message.headers.items() if k not in varying}
    properties = {k: v for k, v in message.properties.items() if k not in varying}
    return headers, properties, message.content_type, json.loads(message.body)[1:]


def test_wakes_published_together_are_the_messages_sent_one_by_one() -> None:
    from project.celery import app

    previous = current_app._get_current_object()
    app.set_current()
    try:
        queue = "durable-batch-format"
        dispatch.celery_sender(dispatch.Message(dispatch.ADVANCE, ("run-0",), queue))
        dispatch.celery_send_many(
            [
                dispatch.Message(dispatch.ADVANCE, ("run-1",), queue),
                dispatch.Message(dispatch.ADVANCE_BATCH, (["run-2", "run-3"],), queue),
                dispatch.Message(dispatch.ADVANCE, ("run-4",), queue),
            ]
        )
        single, *together = _received(app, queue, 4)
    finally:
        previous.set_current()

    assert [json.loads(m.body)[0] for m in (single, *together)] == [
        ["run-0"],
        ["run-1"],
        [["run-2", "run-3"]],
        ["run-4"],
    ]
    assert [m.headers["task"] for m in (single, *together)] == [
        "durable.advance",
        "durable.advance",
        "durable.advance_batch",
        "durable.advance",
    ]
    # The same options, serializer and delivery settings whichever way and in whichever form.
    assert all(_shape(m) == _shape(single) for m in together)


@pytest.mark.django_db(transaction=True)  # autocommit: the wakes leave at once
def test_a_sweeps_wakes_reach_the_broker_as_a_few_batch_messages() -> None:
    from project.celery import app

    previous = current_app._get_current_object()
    app.set_current()
    queue = "durable-batch-wakes"
    ids = [f"run-{i}" for i in range(100)]
    try:
        dispatch.advance_many((run_id, queue) for run_id in ids)
        got = _received(app, queue, dispatch.WAKE_SPREAD)
    finally:
        previous.set_current()
    assert {m.headers["task"] for m in got} == {"durable.advance_batch"}
    assert [run_id for m in got for run_id in json.loads(m.body)[0][0]] == ids
