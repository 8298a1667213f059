"""Durable's database connection around each task it runs: a broken or outlived one is dropped.

Django does this around every request (``close_old_connections``); Celery's Django fix-up does
not under ``CELERY_DB_REUSE_MAX``, so a connection the database dropped would be reused for good.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from . import conf


def concerns_durable(task: Any) -> bool:
    """Whether ``task`` is durable's own or a Celery task run as a step (it then records through durable)."""
    name = getattr(task, "name", None) or ""
    return name.startswith("durable.") or bool(getattr(getattr(task, "request", None), "durable", None))


def close_if_unusable_or_obsolete(task: Any) -> None:
    """Drop durable's connection if it failed (and does not answer) or outlived ``CONN_MAX_AGE``.

    It also re-arms ``CONN_HEALTH_CHECKS``, so the task's first query pings a kept connection
    first and reconnects when the database dropped it in between.
    """
    if getattr(getattr(task, "request", None), "is_eager", False):
        return  # run inside the caller's process and transaction: its connection is the caller's
    connection = connections[conf.get().DATABASE]
    if connection.in_atomic_block:
        return  # never under a transaction someone still holds open
    connection.close_if_unusable_or_obsolete()
