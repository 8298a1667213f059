"""Keep a worker alive through a Redis restart that kombu's Redis transport turns into an exit.

When the broker connection drops, Celery's consumer closes the old connection and opens a new
one. Two things can still reach a channel of the old connection after kombu closed its transport:
the close itself, which gives back the messages the channel holds unacknowledged
(``restore_unacked``), and the acknowledgement of a task the pool finished meanwhile. Both build a
Redis client from the channel's transport, which is gone (``None``, or its ``client`` is), so
they raise ``AttributeError``: not one of the connection errors Celery expects there, so the
worker logs "Unrecoverable error" and exits (seen with kombu 5.7.0, in about one Redis restart
of six; ``tests/e2e/test_server_restarts.py`` restarts Redis under batches of runs).

Here such a channel raises the connection error Celery handles instead ("Couldn't ack", then the
reconnect goes on), and its close skips the give-back. Neither loses anything durable depends
on: a message delivered and not acknowledged stays in the transport's unacked set in Redis,
which kombu itself restores after the ``visibility_timeout``; a Redis that restarted without
persistence lost it anyway; and the sweeps resend every durable message that matters (a turn's
prompt by the safety net, a step by the orphan sweep's probe), fenced so that nothing runs twice.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("durable.celery")

_installed = False


def guard() -> None:
    """Install the two guards on kombu's Redis transport (once; nothing without the redis client)."""
    global _installed
    if _installed:
        return
    try:
        from kombu.transport import redis as transport
        from redis.exceptions import ConnectionError as RedisConnectionError
    except ImportError:
        return
    # Patched on the classes: the channels of every connection the worker opens later need it.
    channel, qos = transport.Channel, transport.QoS
    channel._get_pool = _refused_when_closed(channel._get_pool, RedisConnectionError)  # type: ignore[method-assign]
    qos.restore_unacked = _skipped_when_closed(qos.restore_unacked)  # type: ignore[method-assign]
    _installed = True


def _closed(channel: Any) -> bool:
    return getattr(getattr(channel, "connection", None), "client", None) is None


def _refused_when_closed(get_pool: Callable[..., Any], error: type[Exception]) -> Callable[..., Any]:
    @functools.wraps(get_pool)
    def _get_pool(self: Any, asynchronous: bool = False) -> Any:
        if _closed(self):
            raise error("this channel's broker connection was closed (durable's guard for kombu)")
        return get_pool(self, asynchronous=asynchronous)

    return _get_pool


def _skipped_when_closed(restore: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(restore)
    def restore_unacked(self: Any, client: Any = None) -> Any:
        if client is None and _closed(self.channel):
            log.warning(
                "durable: the broker connection closed before its %d unacknowledged message(s) could "
                "be given back; Redis gives them back after its visibility_timeout, and the sweeps "
                "resend what durable needs",
                len(self._delivered),
            )
            self._delivered.clear()
            return []
        return restore(self, client)

    return restore_unacked
