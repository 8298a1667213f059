"""Durable's database connection around each task it runs: a broken or outlived one is dropped.

Django does this around every request (``close_old_connections``); Celery's Django fix-up does
not under ``CELERY_DB_REUSE_MAX``, so a connection the database dropped would be reused for good.
"""

from __future__ import annotations

import select
from typing import Any

from django.db import connections

from . import conf


def concerns_durable(task: Any) -> bool:
    """Whether ``task`` is durable's own or a Celery task run as a step (it then records through durable)."""
    name = getattr(task, "name", None) or ""
    return name.startswith("durable.") or bool(getattr(getattr(task, "request", None), "durable", None))


def close_if_unusable_or_obsolete(task: Any, *, starting: bool = False) -> None:
    """Drop durable's connection if it failed (and does not answer) or outlived ``CONN_MAX_AGE``.

    It also re-arms ``CONN_HEALTH_CHECKS``, so the task's first query pings a kept connection
    first and reconnects when the database dropped it in between; as ``starting`` the task, not
    when the connection shows it was not dropped (``_quiet``): the task's first query follows.
    """
    if getattr(getattr(task, "request", None), "is_eager", False):
        return  # run inside the caller's process and transaction: its connection is the caller's
    _check(starting=starting)


def check_after_long_call() -> None:
    """Check durable's connection before its next query, as at a task's start, after a call that
    may have run long inside the task (a step's body): the database may have dropped the
    connection meanwhile (a restart, a failover), and the step's result must not be lost to it."""
    _check(starting=True)


def _check(*, starting: bool) -> None:
    connection = connections[conf.get().DATABASE]
    if connection.in_atomic_block:
        return  # never under a transaction someone still holds open
    connection.close_if_unusable_or_obsolete()
    if (
        starting
        and connection.health_check_enabled
        and not connection.health_check_done
        and _quiet(connection)
    ):
        connection.health_check_done = True


def _quiet(connection: Any) -> bool:
    """Whether a kept PostgreSQL connection is known good without asking the server.

    A server that drops a connection (a restart, ``pg_terminate_backend``, an idle timeout, a
    killed backend) sends its reason and closes the socket, so the socket of an idle connection
    has something to read. One with nothing to read is as good as the ``SELECT 1`` of
    ``CONN_HEALTH_CHECKS`` would find it, and that ping cost every task a round trip. Anything to
    read (a notification, say) and the ping runs as before. A peer that vanished without closing
    the socket answers neither: the first query then fails, as the ping would have.
    """
    raw = connection.connection
    if connection.vendor != "postgresql" or raw is None or raw.closed or raw.broken:
        return False
    try:
        readable, _, _ = select.select([raw.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable
