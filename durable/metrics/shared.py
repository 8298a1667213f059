"""The tallies of every process of a host, through ``DURABLE["METRICS_DIR"]``: each process that
records writes its own to ``durable-<pid>.json`` there (a daemon thread, within a second of a
change, and at a worker's shutdown); ``durable.metrics_view`` sums the files it finds.

A counter of a process that ended stays in the sum (its file stays), as Prometheus expects of a
total; a process whose pid is reused overwrites the file, which Prometheus reads as a reset.
Empty the folder when the host's processes are all restarted (a deploy).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from .. import conf

log = logging.getLogger("durable.metrics")

#: How soon a change reaches the process's file.
FLUSH_EVERY = 1.0

_started_in: int | None = None
_start_lock = threading.Lock()
_written = -1


def changed() -> None:
    """A tally changed: have this process's flusher running, when there is a folder to write to."""
    if _started_in != os.getpid():
        _start()


def _start() -> None:
    global _started_in
    with _start_lock:
        if _started_in == os.getpid():
            return
        _started_in = os.getpid()  # a forked pool process starts its own
        if conf.get().METRICS_DIR:
            threading.Thread(target=_flush_forever, daemon=True, name="durable-metrics").start()


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_EVERY)
        flush()


def flush() -> None:
    """Write this process's tallies to its file, if they changed since the last write."""
    global _written
    from .. import metrics

    directory = conf.get().METRICS_DIR
    seen = metrics.changes
    if not directory or seen == _written:
        return
    path = Path(directory) / f"durable-{os.getpid()}.json"
    partial = path.with_name(f".{path.name}.part")
    try:
        partial.write_text(json.dumps(metrics.snapshot()))
        partial.replace(path)  # a reader sees the old file or the new one, never half of one
        _written = seen
    except OSError:
        log.warning("durable: could not write the metrics of this process to %s", path, exc_info=True)


def read(directory: str) -> tuple[dict[Any, float], dict[Any, list[Any]]]:
    """The tallies of every file in ``directory``, summed: (counters, histograms) keyed as the
    process's own (``durable.metrics.counters`` / ``histograms``)."""
    from .instruments import BUCKETS

    counters: dict[Any, float] = {}
    histograms: dict[Any, list[Any]] = {}
    for path in sorted(Path(directory).glob("durable-*.json")):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile, or not ours
        if found.get("buckets") != list(BUCKETS):
            log.warning("durable: %s holds histograms of other buckets (another version): skipped", path)
            continue
        for name, values, total in found["counters"]:
            key = (name, tuple(values))
            counters[key] = counters.get(key, 0.0) + total
        for name, values, buckets, total, count in found["histograms"]:
            key = (name, tuple(values))
            tally = histograms.setdefault(key, [[0] * (len(BUCKETS) + 1), 0.0, 0])
            tally[0] = [a + b for a, b in zip(tally[0], buckets, strict=True)]
            tally[1] += total
            tally[2] += count
    return counters, histograms
