"""The turn leases this process holds, renewed by one thread for the whole process.

A turn that runs long (a slow local step) keeps its lease; a lease the thread fails to renew
because another worker took the run over is marked lost, and the turn stops writing.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from django.db import connections

from .. import clock, conf
from ..models import Run

log = logging.getLogger("durable.engine")

#: Turns this process runs now (run id -> lease owner); handed back on worker shutdown.
active: dict[str, str] = {}
#: Runs whose lease was taken over while their turn ran here.
lost: set[str] = set()
#: durable_env turns renewal off: one thread, a frozen clock.
keep_alive = True

_lock = threading.Lock()
_renewer_pid: int | None = None


#: When each held lease was last taken or renewed (monotonic seconds).
_renewed: dict[str, float] = {}


def hold(run_id: str, owner: str) -> None:
    with _lock:
        active[run_id] = owner
        _renewed[run_id] = time.monotonic()
        lost.discard(run_id)
    if keep_alive:
        _ensure_renewer()


def release(run_id: str) -> None:
    with _lock:
        active.pop(run_id, None)
        _renewed.pop(run_id, None)
        lost.discard(run_id)


def is_lost(run_id: str) -> bool:
    return run_id in lost


def _ensure_renewer() -> None:
    # One thread per process; a forked pool child starts its own.
    global _renewer_pid
    if _renewer_pid == os.getpid():
        return
    with _lock:
        if _renewer_pid == os.getpid():
            return
        _renewer_pid = os.getpid()
    threading.Thread(target=_renew_forever, name="durable-leases", daemon=True).start()


def _renew_forever() -> None:
    while True:
        settings = conf.get()
        every = settings.LEASE.total_seconds() / 3
        # Wake often, renew only the leases held for a third of the lease: most turns end first.
        time.sleep(min(every, 0.5))
        for run_id, owner in list(active.items()):
            if time.monotonic() - _renewed.get(run_id, 0.0) < every:
                continue
            _renewed[run_id] = time.monotonic()
            try:
                renewed = Run.objects.using(settings.DATABASE).renew(run_id, owner, clock.now(), settings.LEASE)
            except Exception:  # noqa: BLE001 - a failed renewal only means the lease may lapse
                log.warning("durable: could not renew the lease of run %s", run_id, exc_info=True)
                continue
            if not renewed:
                with _lock:
                    if active.get(run_id) == owner:
                        lost.add(run_id)
        # Renewals are rare (only long turns): hold no connection between them.
        connections[settings.DATABASE].close()
