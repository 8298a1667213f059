"""Where a run's turns and steps go: the queue a workflow or step names, in the run's namespace.

A namespace's work goes to its own queues, ``<queue>.<namespace>``, so that only the workers
started for it (``celery worker -Q durable.tenant-a``) run it; a run in no namespace uses the queue
as named. A namespace is letters, digits, ``_`` and ``-``: a queue name every broker accepts,
the embedded one's files included.
"""

from __future__ import annotations

import re

NAMESPACE = re.compile(r"\A[A-Za-z0-9_-]*\Z")


def queue_in(queue: str, namespace: str | None) -> str:
    """The queue ``queue`` of namespace ``namespace`` (unchanged without one, or when ``queue`` is
    empty: Celery's own routing places the message)."""
    return f"{queue}.{namespace}" if namespace and queue else queue


def serves(worker: str | None, namespace: str | None) -> bool:
    """Whether a process of namespace ``worker`` (its ``DURABLE["NAMESPACE"]``) does the work of
    namespace ``namespace``: its own only; a process in no namespace does every namespace's."""
    return not worker or (namespace or "") == worker


def remote_base(queue: str, remote: set[str] | frozenset[str]) -> str | None:
    """The remote queue ``queue`` is, itself or in a namespace (``<remote>.<namespace>``); None
    when it is not one."""
    if queue in remote:
        return queue
    return next((base for base in remote if queue.startswith(f"{base}.")), None)


def turn_queue(queue: str, remote: set[str] | frozenset[str], default: str) -> str:
    """Where the ``durable.advance`` of a run whose turns are on ``queue`` goes: a remote queue's
    turns are claimed and sent by durable's own workers (the default queue, in the namespace)."""
    base = remote_base(queue, remote)
    if base is None:
        return queue
    return queue_in(default, queue[len(base) + 1 :] or None)
