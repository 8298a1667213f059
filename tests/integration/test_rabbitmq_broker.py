"""RabbitMQ as the broker: the harness can wipe its queues, and the example project's settings
turn on publisher confirms for it (a message durable counts as sent was taken by the broker)."""

from __future__ import annotations

import runpy
import uuid
from pathlib import Path

import pytest
from celery import current_app
from kombu import Exchange, Queue

from durable import dispatch
from durable.errors import DurableError
from durable.testing import flush_broker
from tests import rabbitmq

SETTINGS = Path(__file__).resolve().parents[2] / "project" / "settings.py"


def _example_settings(monkeypatch: pytest.MonkeyPatch, broker: str, **env: str) -> dict:
    monkeypatch.setenv("CELERY_BROKER_URL", broker)
    monkeypatch.delenv("CELERY_QUORUM_QUEUES", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS))


QUORUM = {
    "CELERY_TASK_DEFAULT_QUEUE_TYPE": "quorum",
    "CELERY_TASK_CREATE_MISSING_QUEUE_TYPE": "quorum",
    "CELERY_TASK_DEFAULT_EXCHANGE_TYPE": "topic",
    "CELERY_TASK_CREATE_MISSING_QUEUE_EXCHANGE_TYPE": "topic",
}


def test_flush_broker_empties_the_queues_on_rabbitmq(rabbitmq_broker):
    name = f"durable-flush-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), routing_key=name)
    with current_app.connection_for_write() as connection:
        producer = connection.Producer()
        for n in range(3):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key=name, declare=[queue])
        try:
            # A queue that was never declared holds nothing and is no error.
            said = flush_broker([name, f"{name}-never-declared"])
            assert said == "purged 3 messages from 1 queue(s)"
            with connection.channel() as channel:
                assert queue(channel).queue_declare(passive=True).message_count == 0
        finally:
            with connection.channel() as channel:
                queue(channel).delete()


def test_a_message_rabbitmq_refuses_is_not_counted_as_sent(rabbitmq_broker):
    """With publisher confirms, a publish RabbitMQ does not take fails where durable sends it
    (the sweeps send it again later); without them it would return as if the message left."""
    name = f"durable-full-{uuid.uuid4().hex[:8]}"
    # A queue that takes one message and refuses the next (a policy, so Celery's own declaration
    # of the queue stays valid).
    policy = '{"max-length": 1, "overflow": "reject-publish"}'
    rabbitmqctl = rabbitmq.rabbitmqctl
    rabbitmqctl("set_policy", "-p", rabbitmq.vhost(), name, f"^{name}$", policy, "--apply-to", "queues")
    try:
        message = dispatch.Message(dispatch.ADVANCE, ("run-1",), name)
        assert dispatch._publish(message)
        assert not dispatch._publish(message)
        # The refusal cost nothing else: the next message to another queue leaves.
        assert flush_broker([name]) == "purged 1 messages from 1 queue(s)"
        assert dispatch._publish(message)
    finally:
        rabbitmqctl("clear_policy", "-p", rabbitmq.vhost(), name)
        with current_app.connection_for_write() as connection, connection.channel() as channel:
            channel.queue_delete(name)


def test_flush_broker_refuses_a_broker_it_cannot_wipe(settings):
    settings.CELERY_BROKER_URL = "sqs://"
    with pytest.raises(DurableError, match="Redis or RabbitMQ"):
        flush_broker(["durable"])


def test_example_settings_on_amqp_turn_on_publisher_confirms(monkeypatch):
    values = _example_settings(monkeypatch, "amqp://guest:guest@127.0.0.1:5672/durable")
    assert values["CELERY_BROKER_TRANSPORT_OPTIONS"] == {"confirm_publish": True}
    assert not QUORUM.keys() & values.keys()  # a queue's type is the project's choice


def test_example_settings_declare_quorum_queues_when_asked(monkeypatch):
    values = _example_settings(
        monkeypatch, "amqp://guest:guest@127.0.0.1:5672/durable", CELERY_QUORUM_QUEUES="1"
    )
    assert {name: values.get(name) for name in QUORUM} == QUORUM


def test_example_settings_on_redis_keep_the_visibility_timeout(monkeypatch):
    values = _example_settings(monkeypatch, "redis://127.0.0.1:6379/0")
    assert values["CELERY_BROKER_TRANSPORT_OPTIONS"] == {"visibility_timeout": 3600}
