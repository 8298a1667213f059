"""The turn leases and step-attempt holds this process has, renewed by one thread per process.

A turn that runs long (a slow local step) keeps its lease; a lease the thread fails to renew
because another worker took the run over (or a cancel ended the run) is marked lost, and the
turn stops at its next primitive. The same thread stops a turn that outruns TURN_TIME_LIMIT. A
step attempt is held the same way from its start until its result is recorded: when this
process dies, its holds lapse within a LEASE and the attempts count as lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from .. import clock, conf, dispatch
from ..errors import _ControlFlow
from ..models import Checkpoint, Run, Status
from . import presence

log = logging.getLogger("durable.engine")

#: Turns this process runs now (run id -> lease owner); handed back on worker shutdown.
active: dict[str, str] = {}
#: Runs whose lease was taken over while their turn ran here.
lost: set[str] = set()

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
    if dispatch.transport.keep_alive:
        _ensure_renewer()


def let_go_attempt(key: tuple[str, int, int]) -> None:
    with _lock:
        attempts.pop(key, None)


def hold(run_id: str, owner: str) -> None:
    with _lock:
        active[run_id] = owner
        _renewed[run_id] = time.monotonic()
        lost.discard(run_id)
    if dispatch.transport.keep_alive:
        _ensure_renewer()


def release(run_id: str) -> None:
    with _lock:
        active.pop(run_id, None)
        _renewed.pop(run_id, None)
        lost.discard(run_id)
        _watched.pop(run_id, None)


def leave(run_id: str | None = None) -> None:
    """This process is leaving (a worker shutting down): hand back its turns' leases, each run's
    turn sent again at once, and let its attempts' holds lapse now, so the next turn counts them
    as lost instead of waiting a LEASE; those of ``run_id`` only, or all. Nothing is recorded as
    an outcome: what the interrupted code was doing is done again elsewhere."""
    settings = conf.get()
    for held_run, owner in list(active.items()):
        if run_id in (None, held_run):
            while_leaving(f"hand back run {held_run}", _hand_back, held_run, owner, settings)
    for key, held in list(attempts.items()):
        if run_id in (None, key[0]):
            checkpoints = Checkpoint.objects.using(settings.DATABASE)
            while_leaving(f"let go of attempt {key}", checkpoints.renew_hold, *key, held[0], clock.now())


def _hand_back(run_id: str, owner: str, settings: conf.Settings) -> None:
    runs = Run.objects.using(settings.DATABASE)
    queue = runs.filter(id=run_id).values_list("queue", flat=True).first()
    if runs.release(run_id, owner, clock.now(), clock.now()):
        dispatch.advance(run_id, queue or settings.DEFAULT_QUEUE)
        log.warning("durable: this process is leaving; run %s handed back to another worker", run_id)


def while_leaving(what: str, write: Callable[..., object], *args: Any) -> None:
    """``write(*args)`` as this process leaves, best effort: the shutdown may have interrupted a
    query on this connection, so a fresh one gets a second try; a failure is logged."""
    for _ in range(2):
        try:
            write(*args)
            return
        except Exception:  # noqa: BLE001 - the lease or hold lapses instead, as if killed
            connections[conf.get().DATABASE].close()
    log.warning("durable: could not %s while leaving; the sweeps repair it after a LEASE", what)


def is_lost(run_id: str) -> bool:
    return run_id in lost


def keep() -> None:
    """Start this process's keeper thread now (a worker's main process, for its presence)."""
    _ensure_renewer()


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
            renewed = _try(
                runs.renew, run_id, owner, clock.now(), settings.LEASE, what=f"the lease of run {run_id}"
            )
            if renewed is False:
                with _lock:
                    if active.get(run_id) == owner:
                        lost.add(run_id)
            elif renewed is None:
                _retry_soon(_renewed, run_id, every)
        for key, held in list(attempts.items()):
            if time.monotonic() - held[1] < every:
                continue
            held[1] = time.monotonic()
            # A hold declared lost (False) is left to the turn that counts it; the step's result
            # will be refused as stale if its attempt moved on meanwhile.
            checkpoints = Checkpoint.objects.using(settings.DATABASE)
            renewed = _try(
                checkpoints.renew_hold, *key, held[0], clock.now() + settings.LEASE, what=f"the hold of {key}"
            )
            if renewed is None:
                held[1] -= every  # tried again at the next wake-up, as a lease is
        _watch_turns(settings)
        presence.tick()
        # Renewals are rare (only long turns and steps): hold no connection between them.
        connections[settings.DATABASE].close()


def _retry_soon(renewed: dict[str, float], run_id: str, every: float) -> None:
    """Renew at the next wake-up a lease whose renewal failed: the database may be back by then,
    and the orphan sweep judges a lease left lapsed after an outage at its next pass."""
    with _lock:
        if run_id in renewed:
            renewed[run_id] -= every


def _try(renew: Callable[..., bool], *args: Any, what: str) -> bool | None:
    try:
        return renew(*args)
    except Exception:  # noqa: BLE001 - a failed renewal only means the lease may lapse
        log.warning("durable: could not renew %s", what, exc_info=True)
        # A broken connection must not fail every renewal after it.
        connections[conf.get().DATABASE].close()
        return None


# -- stopping turns ------------------------------------------------------------------------
#
# A turn must stop when its lease is gone (a cancel ended the run, another worker took it over)
# or when it has run for TURN_TIME_LIMIT. Each primitive asks ``stopping()`` (in memory, no
# query), so a body that calls primitives stops at its next one. A body that never calls one
# (``while True: pass``, a local step stuck in pure Python) cannot be asked: this thread raises
# ``Interrupted`` inside the turn's thread (PyThreadState_SetAsyncExc, delivered at its next
# bytecode; a thread blocked in C code gets it when the call returns), once per watched turn and
# only while the turn is inside replay(). Everything the turn writes is fenced by its lease and
# each flush is one statement or one transaction, so wherever the exception lands the database
# holds a prefix of the turn, which the next turn replays. A body that swallows even that
# (``except BaseException`` in its loop) is abandoned after ABANDON_AFTER: its run is handed back
# as crashed from this thread and, in a Celery pool child, the process ends (``os._exit``: no
# Python code of the stuck thread runs again) and the pool starts a fresh one; the message is
# redelivered (``reject_on_worker_lost``) and finds the run handed back. A process that is not a
# pool child (solo or threads pool, tests) must not exit: the stuck thread is logged instead.

#: Set in Celery prefork pool children, which may end themselves (the pool replaces them).
may_exit = False
#: A turn that has run this long has its lease checked this often (one SELECT for all), so a
#: cancel reaches it within about a second rather than a third of LEASE.
HELD_CHECK_EVERY = 1.0
#: Seconds a turn gets to unwind after Interrupted before it is abandoned.
ABANDON_AFTER = 5.0


#: The owner a turn replayed ahead of any claim is watched under (``first_turns``): it holds no
#: lease, and is lost once anything takes or ends its run.
AHEAD = ""


class Interrupted(_ControlFlow):
    """This turn must stop: its lease is gone, or it ran past TURN_TIME_LIMIT."""


@dataclass
class _Watch:
    owner: str
    thread: int
    deadline: datetime
    give_back: Callable[[], object]
    #: The keeper's clock (time.monotonic, read in the keeper thread only) when it last checked
    #: the lease, or first saw the turn: most turns end before it looks at them twice.
    checked: float | None = None
    interrupted: float | None = None
    abandoned: bool = False


#: Turns inside replay() now (run id -> watch), the only ones Interrupted may be raised into.
_watched: dict[str, _Watch] = {}


def watch(run_id: str, owner: str, limit: timedelta, give_back: Callable[[], object]) -> None:
    """Watch the calling thread's turn of ``run_id`` until ``unwatch``; ``give_back`` hands the
    run back as crashed when the turn must be abandoned."""
    entry = _Watch(owner, threading.get_ident(), clock.now() + limit, give_back)
    with _lock:
        _watched[run_id] = entry
    if dispatch.transport.keep_alive:
        _ensure_renewer()  # the keeper watches (a first turn written ahead holds no lease)


def unwatch(run_id: str) -> None:
    """Stop watching; drop an Interrupted raised into this thread and not delivered yet."""
    while True:
        try:
            with _lock:
                entry = _watched.pop(run_id, None)
                if entry is not None and entry.interrupted is not None:
                    _raise_in(entry.thread, None)
            return
        except Interrupted:
            # The one exception raised into this turn landed here: the watch is what matters.
            continue


@contextlib.contextmanager
def unwatched(run_id: str) -> Iterator[None]:
    """Run a step in place outside the watch: the step's time does not count against
    TURN_TIME_LIMIT (a step has no such limit) and nothing is raised into the step's code (a
    cancel reaches the turn at its next primitive, after the step)."""
    with _lock:
        entry = _watched.pop(run_id, None)
    began = clock.now()
    try:
        yield
    finally:
        if entry is not None:
            entry.deadline += clock.now() - began
            with _lock:
                _watched[run_id] = entry


def stopping(run_id: str) -> Interrupted | None:
    """The exception that stops the turn of ``run_id`` now, or None. In memory: cheap."""
    if run_id in lost:
        return Interrupted(f"the lease of run {run_id} is gone (cancelled or taken over)")
    entry = _watched.get(run_id)
    if entry is not None and clock.now() >= entry.deadline:
        return Interrupted(f"the turn of run {run_id} ran past TURN_TIME_LIMIT")
    return None


def _raise_in(thread: int, exc: type[BaseException] | None) -> None:
    # None clears a pending exception; ctypes passes None as NULL.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc) if exc else None)


def _watch_turns(settings: conf.Settings) -> None:
    """One pass of the keeper over the turns inside replay(): check leases, stop, abandon."""
    if not _watched:
        return
    _check_held(settings)
    now, mono = clock.now(), time.monotonic()
    for run_id, entry in list(_watched.items()):
        if run_id not in lost and now < entry.deadline:
            continue
        if entry.interrupted is None:
            with _lock:
                if _watched.get(run_id) is not entry:
                    continue
                entry.interrupted = mono
                _raise_in(entry.thread, Interrupted)
            log.warning(
                "durable: stopping the turn of run %s (%s)",
                run_id,
                "its lease is gone" if run_id in lost else "it ran past TURN_TIME_LIMIT",
            )
        elif not entry.abandoned and mono - entry.interrupted >= ABANDON_AFTER:
            _abandon(run_id, entry)


def _check_held(settings: conf.Settings) -> None:
    """Mark lost the watched turns whose run no longer names them (cancelled, taken over)."""
    mono = time.monotonic()
    for entry in list(_watched.values()):
        if entry.checked is None:
            entry.checked = mono
    due = {
        run_id: entry
        for run_id, entry in list(_watched.items())
        if run_id not in lost and mono - (entry.checked or mono) >= HELD_CHECK_EVERY
    }
    if not due:
        return
    for entry in due.values():
        entry.checked = mono
    try:
        rows = Run.objects.using(settings.DATABASE).filter(id__in=list(due))
        holders = {
            run_id: (holder, status)
            for run_id, holder, status in rows.values_list("id", "locked_by", "status")
        }
    except Exception:  # noqa: BLE001 - the next pass asks again; renewal still fences the turn
        log.warning("durable: could not check the leases of running turns", exc_info=True)
        return
    with _lock:
        for run_id, entry in due.items():
            if _watched.get(run_id) is not entry:
                continue  # ended while the rows were read; a turn watched since is read next pass
            holder, status = holders.get(run_id, (None, None))
            if entry.owner == AHEAD:
                if holder is not None or status != Status.PENDING:
                    lost.add(run_id)  # taken or ended since it was read: the write would be refused
            elif holder != entry.owner and active.get(run_id) == entry.owner:
                lost.add(run_id)


def _abandon(run_id: str, entry: _Watch) -> None:
    """The turn ignored Interrupted: hand its run back as crashed and, in a pool child, exit."""
    with _lock:
        if _watched.get(run_id) is not entry:
            return
        entry.abandoned = True
    try:
        entry.give_back()
    except Exception:  # noqa: BLE001 - the orphan sweep takes the run back once the lease lapses
        log.warning("durable: could not hand back run %s", run_id, exc_info=True)
    if may_exit:
        log.error(
            "durable: the turn of run %s ignored being stopped; ending this pool process "
            "(pid %s) so the pool starts a fresh one",
            run_id,
            os.getpid(),
        )
        os._exit(1)
    log.error(
        "durable: the turn of run %s ignored being stopped and still holds thread %s of "
        "process %s; its run was handed back, restart this process to free the thread",
        run_id,
        entry.thread,
        os.getpid(),
    )
