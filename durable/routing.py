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
