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
