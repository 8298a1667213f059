"""The RabbitMQ the tests run on, driven through ``rabbitmqctl`` and scoped to the broker URL's
vhost, so a test never touches another suite's queues or connections."""

from __future__ import annotations

import shutil
import subprocess
from urllib.parse import unquote, urlparse

from django.conf import settings


def vhost() -> str:
    """The vhost of CELERY_BROKER_URL (``/`` when the URL names none)."""
    path = urlparse(settings.CELERY_BROKER_URL).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def rabbitmqctl(*args: str) -> str:
    """Run ``rabbitmqctl ARGS`` (it needs the node's Erlang cookie, so root or the rabbitmq user)."""
    if shutil.which("rabbitmqctl") is None:
        raise RuntimeError("rabbitmqctl is not installed here: these tests drive the local RabbitMQ node")
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stderr or done.stdout}")
    return done.stdout


def connections() -> list[str]:
    """The pids of the client connections open on this vhost."""
    rows = rabbitmqctl("list_connections", "--no-table-headers", "vhost", "pid").splitlines()
    return [pid for host, _, pid in (row.partition("\t") for row in rows) if host == vhost()]


def close_connections(reason: str) -> int:
    """Close every client connection on this vhost, as a broker restart or a node's failover
    would; return how many."""
    pids = connections()
    for pid in pids:
        # A connection that closed meanwhile is no error: it was the point.
        subprocess.run(
            ["rabbitmqctl", "-q", "close_connection", pid, reason], capture_output=True, timeout=60
        )
    return len(pids)
