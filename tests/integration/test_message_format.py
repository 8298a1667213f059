"""durable's messages are JSON whatever the project's Celery serializer: a project that pickles
its own tasks still sends durable's as JSON, which a worker of any language can read."""

from __future__ import annotations

import json

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


def test_wakes_sent_in_a_batch_are_the_same_messages_as_one_by_one() -> None:
    from project.celery import app

    previous = current_app._get_current_object()
    app.set_current()
    try:
        queue = "durable-batch-format"
        dispatch.celery_sender(dispatch.Message(dispatch.ADVANCE, ("run-0",), queue))
        dispatch.celery_send_many(
            [dispatch.Message(dispatch.ADVANCE, (f"run-{i}",), queue) for i in (1, 2, 3)]
        )
        single, *batched = _received(app, queue, 4)
    finally:
        previous.set_current()

    def shape(message):
        varying = {"id", "root_id", "correlation_id", "delivery_tag", "argsrepr"}
        headers = {k: v for k, v in message.headers.items() if k not in varying}
        properties = {k: v for k, v in message.properties.items() if k not in varying}
        return headers, properties, message.content_type, json.loads(message.body)[1:]

    assert [json.loads(m.body)[0] for m in (single, *batched)] == [[f"run-{i}"] for i in range(4)]
    assert all(shape(m) == shape(single) for m in batched)
    assert single.headers["task"] == "durable.advance"
