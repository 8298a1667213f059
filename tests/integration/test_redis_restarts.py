"""The close that kombu's Redis transport turns into a worker's exit when Redis restarts.

Celery's consumer, reconnecting after a lost broker connection, closes the old connection; a
channel of it whose transport kombu closed first raises ``AttributeError`` when it gives back the
messages it holds unacknowledged or acknowledges one, and the worker exits ("Unrecoverable
error"). Here that state is built on the suite's Redis with kombu itself, one message delivered
and not acknowledged; ``tests/e2e/test_server_restarts.py`` restarts a real Redis under a worker.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings
from kombu import Connection, Queue
from kombu.message import Message
from kombu.transport import redis as transport

from durable import redis_restarts


def deliver(connection: Connection) -> tuple[Queue, str]:
    """One message on a queue of this test's own, delivered on ``connection`` and not acknowledged."""
    queue = Queue(f"durable-test-restore-{uuid.uuid4().hex}")
    channel = connection.default_channel
    connection.Producer(channel).publish({"n": 1}, routing_key=queue.name, declare=[queue])
    message = queue(channel).get(no_ack=False)
    assert message is not None and list(channel.qos._delivered) == [message.delivery_tag]
    delivered.append((queue.name, message.delivery_tag))
    return queue, message.delivery_tag


#: What this test delivered: its queue and the message's entry in the unacked set go at teardown.
delivered: list[tuple[str, str]] = []


@pytest.fixture
def connection(redis_broker: None) -> Iterator[Connection]:
    connection = Connection(settings.CELERY_BROKER_URL)
    yield connection
    connection.transport.client = connection  # as close_transport_first found it
    connection.release()
    with Connection(settings.CELERY_BROKER_URL) as other:
        client, channel = other.default_channel.client, other.default_channel
        for queue, tag in delivered:
            client.delete(queue)
            client.hdel(channel.unacked_key, tag)
            client.zrem(channel.unacked_index_key, tag)
    delivered.clear()


def close_transport_first(connection: Connection) -> None:
    """What Celery's consumer meets when it closes a connection whose transport closed first."""
    assert connection.default_channel.connection is connection.transport
    connection.transport.client = None


def unguard(monkeypatch: pytest.MonkeyPatch, *methods: tuple[type, str]) -> None:
    for owner, name in methods:
        method = getattr(owner, name)
        monkeypatch.setattr(owner, name, getattr(method, "__wrapped__", method))


RESTORE = (transport.QoS, "restore_unacked")
POOL = (transport.Channel, "_get_pool")


@pytest.fixture
def unguarded(monkeypatch: pytest.MonkeyPatch) -> None:
    unguard(monkeypatch, RESTORE, POOL)


def test_unguarded_the_close_raises_what_celery_does_not_ignore(connection, unguarded):
    deliver(connection)
    close_transport_first(connection)
    with pytest.raises(AttributeError) as raised:
        connection.default_channel.close()
    assert not isinstance(raised.value, connection.connection_errors + connection.channel_errors)


def closed_with_a_message_to_ack(connection: Connection) -> Message:
    """A message whose channel closed after its transport (the close skipping the give-back),
    still to be acknowledged: its task ended after the worker reconnected."""
    deliver(connection)
    channel = connection.default_channel
    message = channel.qos.get(next(iter(channel.qos._delivered)))
    close_transport_first(connection)
    channel.close()
    return message


def test_with_the_close_guarded_alone_an_ack_on_the_closed_channel_raises(connection, monkeypatch):
    """What a worker met once the give-back was skipped: the ack of a task that ended meanwhile."""
    redis_restarts.guard()
    unguard(monkeypatch, POOL)
    message = closed_with_a_message_to_ack(connection)
    with pytest.raises(AttributeError):
        message.ack_log_error(logging.getLogger("test"), connection.connection_errors)


def test_guarded_an_ack_on_the_closed_channel_is_a_connection_error_celery_logs(connection, caplog):
    redis_restarts.guard()
    message = closed_with_a_message_to_ack(connection)
    message.ack_log_error(logging.getLogger("test"), connection.connection_errors)
    assert "Couldn't ack" in caplog.text and "broker connection was closed" in caplog.text


def test_guarded_the_close_goes_on_and_the_message_waits_for_its_visibility_timeout(connection):
    redis_restarts.guard()
    queue, tag = deliver(connection)
    channel = connection.default_channel
    close_transport_first(connection)
    channel.close()
    assert channel.closed and not channel.qos._delivered
    with Connection(settings.CELERY_BROKER_URL) as other:
        client = other.default_channel.client
        # Still in the transport's unacked set, where kombu's restore_visible finds it later.
        assert client.hexists(channel.unacked_key, tag)
        assert client.llen(queue.name) == 0


def test_guarded_a_close_with_its_transport_open_gives_the_message_back_at_once(connection):
    redis_restarts.guard()
    queue, tag = deliver(connection)
    channel = connection.default_channel
    channel.close()
    with Connection(settings.CELERY_BROKER_URL) as other:
        client = other.default_channel.client
        assert not client.hexists(channel.unacked_key, tag)
        assert client.llen(queue.name) == 1
