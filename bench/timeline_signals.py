"""Loaded by the worker of ``bench/step_timeline.py`` (``--include``): each process notes when a
task was received, started, published a message and ended, one line per event, in a file of
its own under ``BENCH_TIMELINE_DIR``. Celery's own signals: the same for durable and the chain."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, TextIO

from celery import signals

_out: dict[int, TextIO] = {}


def _note(event: str, task: str) -> None:
    pid = os.getpid()
    if pid not in _out:
        path = Path(os.environ["BENCH_TIMELINE_DIR"]) / f"{pid}.log"
        _out[pid] = path.open("a", buffering=1)
    _out[pid].write(f"{time.time_ns()} {pid} {event} {task}\n")


@signals.task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    _note("received", request.name)


@signals.task_prerun.connect
def _started(sender: Any = None, **_: Any) -> None:
    _note("started", sender.name)


@signals.after_task_publish.connect
def _published(sender: Any = None, **_: Any) -> None:
    _note("published", sender)


@signals.task_postrun.connect
def _ended(sender: Any = None, **_: Any) -> None:
    _note("ended", sender.name)
