"""Heartbeats of workers and sweeps in the Presence table: a worker notes its queues and
workflows at start-up and then every PRESENCE_INTERVAL (from the lease keeper thread); each
sweep pass notes when it ran and what it did."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timedelta

from .. import clock, conf
from ..definitions import registry
from ..models import Presence

log = logging.getLogger("durable.engine")

#: Rows not seen for this long are deleted by the retention sweep.
FORGET_AFTER = timedelta(days=1)

#: This worker as announced: (pid of the announcing process, node name, queues); None elsewhere.
_me: tuple[int, str, list[str]] | None = None
_last_beat = 0.0
#: Set by leaving(): the keeper thread deletes the row at its next pass.
_leaving = False


def registered_workflows() -> list[str]:
    return sorted(
        f"{name}@{version}" for name, versions in registry.workflows.items() for version in versions
    )


#: Held by the keeper thread's beat and by leave(), so a beat in flight cannot land after the
#: row's deletion.
_writing = threading.Lock()


def announce(node: str, queues: list[str]) -> None:
    """Note this worker process as alive, serving ``queues``; the keeper thread keeps it so."""
    global _me, _last_beat
    _me = (os.getpid(), f"{node} (pid {os.getpid()})", sorted(queues))
    _last_beat = time.monotonic()
    _write()


def tick() -> None:
    """Called often by the keeper thread: renew this worker's row once per PRESENCE_INTERVAL, or
    delete it once the worker began leaving."""
    global _last_beat
    if _me is None or _me[0] != os.getpid():
        return  # not a worker's main process (a pool child, a web process)
    if _leaving:
        try:
            leave()
        except Exception:  # noqa: BLE001 - tried again at shutdown's end, else it ages out
            log.warning("durable: could not take this worker off the health page", exc_info=True)
        return
    if time.monotonic() - _last_beat < conf.get().PRESENCE_INTERVAL.total_seconds():
        return
    _last_beat = time.monotonic()
    with _writing:  # never after leave() deleted the row: a beat then would bring it back
        if _me is None:
            return
        try:
            _write()
        except Exception:  # noqa: BLE001 - a missed beat only makes the worker look late
            log.warning("durable: could not note this worker as alive", exc_info=True)


def leaving() -> None:
    """The worker began its shutdown (called from Celery's signal handler, so it only notes it):
    its row goes at the keeper's next pass, half a second at most, not after the pool stopped,
    which a prefork pool whose children were signalled too can take until it is killed."""
    global _leaving
    _leaving = True


def leave() -> None:
    """A clean shutdown of this worker: delete its row, so no page lists it alive until its last
    beat ages out. A worker killed outright leaves its row to age out as before."""
    global _me
    if _me is None or _me[0] != os.getpid():
        return  # a pool child's shutdown: its main process is still serving
    with _writing:
        if _me is None:
            return  # the keeper's pass took it off already
        Presence.objects.using(conf.get().DATABASE).filter(kind=Presence.WORKER, who=_me[1]).delete()
        _me = None


def _write() -> None:
    assert _me is not None
    settings = conf.get()
    Presence.objects.using(settings.DATABASE).seen(
        Presence.WORKER, _me[1], clock.now(), queues=_me[2], workflows=registered_workflows()
    )


def _sweep_name(task: str) -> str:
    namespace = conf.get().NAMESPACE
    return f"{task}@{namespace}" if namespace else task


def sweep_ran(task: str, did: int) -> None:
    """Note a sweep's pass (one UPDATE): the health page and stuck runs read when beat last swept."""
    settings = conf.get()
    Presence.objects.using(settings.DATABASE).seen(
        Presence.SWEEP, _sweep_name(task), clock.now(), detail={"did": did}
    )


def last_pass(task: str) -> datetime | None:
    """When the sweep sent as ``task`` last noted a pass (in this namespace), if it ever did."""
    settings = conf.get()
    passes = Presence.objects.using(settings.DATABASE).filter(kind=Presence.SWEEP, who=_sweep_name(task))
    return passes.values_list("last_seen", flat=True).first()


def prune() -> int:
    settings = conf.get()
    return Presence.objects.using(settings.DATABASE).prune(clock.now() - FORGET_AFTER)
