"""A Celery worker that knows nothing of durable or Django: only ``@shared_task`` functions.

Started by the remote e2e tests as ``celery -A tests.e2e.plain_worker worker -Q plain`` with no
database settings at all. Its tasks stand for work on another box (a GPU, a partner's network):
durable sends them as steps and learns their results through Celery's own ``link`` /
``link_error`` callbacks, and their heartbeats through ``durable.heartbeat`` messages sent by
name. Each run of a task appends a line to ``$PLAIN_WORKER_LOG`` so tests can count them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery, shared_task, signals

app = Celery("plain_worker", broker=os.environ["CELERY_BROKER_URL"])
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@signals.worker_ready.connect
def _say_what_is_loaded(**_: Any) -> None:
    # kombu imports django.utils when Django is installed (to encode lazy strings): what counts
    # is that neither durable nor Django's settings or ORM were loaded.
    loaded = sorted(name for name in ("durable", "django.conf", "django.db") if name in sys.modules)
    print(f"plain worker modules: {loaded or 'no durable, no Django settings or ORM'}", flush=True)


def _note(line: str) -> None:
    with open(os.environ["PLAIN_WORKER_LOG"], "a") as log:
        log.write(line + "\n")


def _beat(task: Any, progress: Any) -> None:
    """Send durable.heartbeat by name, as the attempt header says (protocol v1)."""
    where = task.request.durable_attempt
    task.app.send_task(
        "durable.heartbeat",
        kwargs={
            "run_id": where["run_id"],
            "seq": where["seq"],
            "attempt": where["attempt"],
            "token": where["token"],
            "progress": progress,
        },
        queue=where["reply_to"],
        serializer="json",
    )


@shared_task(name="plain.add")
def add(a: int, b: int = 0) -> int:
    _note(f"add {a} {b}")
    return a + b


@shared_task(name="plain.boom")
def boom(why: str) -> None:
    _note(f"boom {why}")
    raise ValueError(why)


@shared_task(name="plain.long", bind=True)
def long(self: Any, seconds: float) -> str:
    """Run ``seconds``, beating every quarter second."""
    _note(f"long {self.request.durable_attempt['attempt']}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _beat(self, {"left": round(deadline - time.monotonic(), 1)})
        time.sleep(0.25)
    return "done"


@shared_task(name="tests.e2e_remote_double", bind=True)
def remote_double(self: Any, x: int) -> int:
    """The body of the remote step ``tests.e2e_remote_double`` (declared on durable's side)."""
    _note(f"double {x} attempt {self.request.durable_attempt['attempt']}")
    _beat(self, {"x": x})
    return x * 2


@shared_task(name="tests.e2e_remote_stuck", bind=True)
def remote_stuck(self: Any, x: int) -> int:
    """Its first attempt beats until the worker is killed; later attempts finish at once."""
    attempt = self.request.durable_attempt["attempt"]
    _note(f"stuck {x} attempt {attempt}")
    _beat(self, {"attempt": attempt})
    if attempt == 1:
        Path(os.environ["PLAIN_WORKER_LOG"] + ".hung").write_text("1")
        for _ in range(2400):
            _beat(self, {"attempt": attempt})
            time.sleep(0.25)
    return x + 100
