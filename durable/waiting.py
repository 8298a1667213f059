"""Waking a caller that waits for a run to end: PostgreSQL notifies, received by one listening
connection per process, with the caller's own polling as the fallback.

The transaction that ends a run sends ``NOTIFY`` (a trigger, migration 0014); PostgreSQL
delivers it when that transaction commits. Here one daemon thread holds a connection that
``LISTEN``s and sets the event of every caller waiting for that run. A notification that is lost
(the listener reconnecting, another database, psycopg 2) costs the caller one poll interval.
A caller on an event loop (``durable.aresult``) subscribes an awaitable event instead: the
listener thread sets it through the loop, so no thread is parked for the caller's wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from django.db import connections

from .models.runs import RUN_ENDED

log = logging.getLogger("durable.waiting")

#: Seconds a broken listener waits before it connects again; callers poll meanwhile.
RECONNECT_AFTER = 5.0
#: Seconds a listener no one waits on keeps its connection; the next wait opens a new one.
IDLE_AFTER = 60.0


class Waker(Protocol):
    """What the listener sets when a run is announced: a ``threading.Event`` or a ``LoopEvent``."""

    def set(self) -> None: ...


class LoopEvent:
    """An ``asyncio.Event`` that the listener thread may set: the set runs on the event's loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def set(self) -> None:
        # A loop that closed meanwhile has no one left to wake.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.event.set)

    async def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the set; whether it came."""
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
        except TimeoutError:
            return False
        return True


class Listener:
    """One LISTEN connection of this process, and the callers waiting on it, by run id."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.waiting: dict[str, set[Waker]] = {}
        self.listening = threading.Event()
        self.stopped = threading.Event()
        self.idle_since = time.monotonic()
        self.thread = threading.Thread(target=self._listen, name="durable-result-listener", daemon=True)
        self.thread.start()
        # Callers read the run only once LISTEN is in place, so no end can slip between the two.
        self.listening.wait(5)

    def subscribe(self, run_id: str) -> contextlib.AbstractContextManager[threading.Event]:
        """An event set when ``run_id`` is announced as ended (subscribe before reading the run)."""
        return self._subscribed(run_id, threading.Event())

    def subscribe_async(self, run_id: str) -> contextlib.AbstractContextManager[LoopEvent]:
        """As ``subscribe``, for a caller on the running event loop: the event is awaited."""
        return self._subscribed(run_id, LoopEvent())

    @contextmanager
    def _subscribed(self, run_id: str, event: Any) -> Iterator[Any]:
        with self.lock:
            self.waiting.setdefault(run_id, set()).add(event)
            self.idle_since = time.monotonic()
        try:
            yield event
        finally:
            with self.lock:
                events = self.waiting.get(run_id, set())
                events.discard(event)
                if not events:
                    self.waiting.pop(run_id, None)
                self.idle_since = time.monotonic()

    @property
    def live(self) -> bool:
        return self.listening.is_set() and not self.stopped.is_set()

    def stop(self) -> None:
        """Close the connection (within a second) and let the callers poll."""
        self.stopped.set()
        self.thread.join(5)

    def _idle(self) -> bool:
        with self.lock:
            return not self.waiting and time.monotonic() - self.idle_since > IDLE_AFTER

    def _listen(self) -> None:
        while not self.stopped.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {RUN_ENDED}")
                    self.listening.set()
                    while not self.stopped.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            self._wake(notice.payload)
                        if self._idle():
                            self.stopped.set()  # an idle process holds no connection
            except Exception:  # noqa: BLE001 - callers poll until the listener is back
                log.warning("durable: the result listener lost its connection; callers poll", exc_info=True)
            self.listening.clear()
            # Whoever waits now may have missed a notice: wake them all to look again.
            with self.lock:
                for events in self.waiting.values():
                    for event in events:
                        event.set()
            self.stopped.wait(RECONNECT_AFTER)

    def _connect(self) -> Any:
        wrapper = connections[self.alias]
        conn = wrapper.Database.connect(**wrapper.get_connection_params())
        conn.autocommit = True
        return conn

    def _wake(self, run_id: str) -> None:
        with self.lock:
            for event in self.waiting.get(run_id, ()):
                event.set()


_listeners: dict[str, Listener] = {}
_guard = threading.Lock()


def listener(alias: str) -> Listener | None:
    """This process's listener on database ``alias``; None where runs are not announced
    (not PostgreSQL with psycopg 3), or while it cannot listen."""
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql" or wrapper.Database.__name__ != "psycopg":
        return None
    with _guard:
        found = _listeners.get(alias)
        # A forked child starts its own; an idle one that closed is replaced.
        if found is None or found.pid != os.getpid() or found.stopped.is_set():
            found = _listeners[alias] = Listener(alias)
    return found if found.live else None


def stop_all() -> None:
    """Close every listener of this process (say before a test database is dropped)."""
    with _guard:
        found = [one for one in _listeners.values() if one.pid == os.getpid()]
        _listeners.clear()
    for one in found:
        one.stop()
