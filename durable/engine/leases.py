"""The turn leases and step-attempt holds this process has, renewed by one thread per process.

A turn that runs long (a slow local step) keeps its lease; a lease the thread fails to renew
because another worker took the run over is marked lost, and the turn stops writing. A step
attempt is held the same way from its start until its result is recorded: when this process
dies, its holds lapse within a LEASE and the attempts count as lost.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connections

from .. import clock, conf
from ..models import Checkpoint, Run

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

#: Step attempts this process runs now: (run id, seq, attempt) -> [holder, last renewed].
attempts: dict[tuple[str, int, int], list] = {}
_holder: tuple[int, str] | None = None


def process_holder() -> str:
    """This process's name on the attempts it holds (a forked child gets a name of its own)."""
    global _holder
    if _holder is None or _holder[0] != os.getpid():
        _holder = (os.getpid(), f"{conf.get().INSTANCE_ID}/{os.getpid()}-{uuid.uuid4().hex[:8]}")
    return _holder[1]


def hold_attempt(key: tuple[str, int, int], holder: str) -> None:
    with _lock:
        attempts[key] = [holder, time.monotonic()]
    if keep_alive:
        _ensure_renewer()


def let_go_attempt(key: tuple[str, int, int]) -> None:
    with _lock:
        attempts.pop(key, None)


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
        # Wake often, renew only what was held for a third of the lease: most turns end first.
        time.sleep(min(every, 0.5))
        for run_id, owner in list(active.items()):
            if time.monotonic() - _renewed.get(run_id, 0.0) < every:
                continue
            _renewed[run_id] = time.monotonic()
            runs = Run.objects.using(settings.DATABASE)
            renewed = _try(runs.renew, run_id, owner, clock.now(), settings.LEASE, what=f"the lease of run {run_id}")
            if renewed is False:
                with _lock:
                    if active.get(run_id) == owner:
                        lost.add(run_id)
        for key, held in list(attempts.items()):
            if time.monotonic() - held[1] < every:
                continue
            held[1] = time.monotonic()
            # A hold declared lost (False) is left to the turn that counts it; the step's result
            # will be refused as stale if its attempt moved on meanwhile.
            checkpoints = Checkpoint.objects.using(settings.DATABASE)
            _try(checkpoints.renew_hold, *key, held[0], clock.now() + settings.LEASE, what=f"the hold of {key}")
        # Renewals are rare (only long turns and steps): hold no connection between them.
        connections[settings.DATABASE].close()


def _try(renew: Callable[..., bool], *args: Any, what: str) -> bool | None:
    try:
        return renew(*args)
    except Exception:  # noqa: BLE001 - a failed renewal only means the lease may lapse
        log.warning("durable: could not renew %s", what, exc_info=True)
        # A broken connection must not fail every renewal after it.
        connections[conf.get().DATABASE].close()
        return None
