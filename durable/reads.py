"""Callers' reads from a streaming replica: ``DURABLE["READ_DATABASE"]``.

What a caller reads about runs (``get_run``, ``result``'s polls, ``query``, the admin's lists,
the CLI's) may come from a replica of ``DATABASE``; what the engine reads to decide and write
never does. A replica is read while its replay lags the primary by at most
``READ_DATABASE_MAX_LAG``, asked at most once a second per process; past it, unreachable, or
failing a read, the primary is read instead (an unreachable replica is asked again a second
later). A run the replica does not hold yet (started a moment ago) is looked up on the primary,
so a caller reads its own starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections

from . import conf

log = logging.getLogger("durable.reads")

T = TypeVar("T")

#: Seconds a process trusts its last reading of the replica's lag.
LAG_READ_EVERY = 1.0

#: The replica's lag in seconds: none while it has replayed all it received from a primary it is
#: still receiving from; else the age of its last replayed commit (None: it replayed none).
LAG = """
SELECT CASE
    WHEN NOT pg_is_in_recovery() THEN 0
    WHEN NOT EXISTS (SELECT 1 FROM pg_stat_wal_receiver) THEN NULL
    WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
    ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())
END
"""


class _Lag:
    """The last reading of the replica's lag in this process: (alias, whether readable, when)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reading: tuple[str, bool, float] | None = None


_lag = _Lag()


def database() -> str:
    """The alias a caller's read goes to now: the replica while it is close enough, else the
    primary."""
    settings = conf.get()
    replica = settings.READ_DATABASE
    if replica is None or replica == settings.DATABASE:
        return settings.DATABASE
    now = time.monotonic()
    with _lag.lock:
        reading = _lag.reading
        if reading is None or reading[0] != replica or now - reading[2] > LAG_READ_EVERY:
            reading = _lag.reading = (replica, _close_enough(replica, settings), now)
    return replica if reading[1] else settings.DATABASE


def _close_enough(replica: str, settings: conf.Settings) -> bool:
    try:
        with connections[replica].cursor() as cursor:
            cursor.execute(LAG)
            (lag,) = cursor.fetchone()
    except (OperationalError, InterfaceError):
        log.warning("durable: the replica %r did not answer; reading the primary", replica, exc_info=True)
        connections[replica].close()
        return False
    return lag is not None and lag <= settings.READ_DATABASE_MAX_LAG.total_seconds()


def read(fetch: Callable[[str], T | None]) -> T | None:
    """``fetch(alias)`` from where callers read now; from the primary too when the replica does
    not hold it yet (None) or fails the read (then it is not read for a second)."""
    settings = conf.get()
    alias = database()
    if alias == settings.DATABASE:
        return fetch(alias)
    try:
        found = fetch(alias)
    except (OperationalError, InterfaceError):
        log.warning("durable: a read from the replica %r failed; reading the primary", alias, exc_info=True)
        connections[alias].close()
        with _lag.lock:
            _lag.reading = (alias, False, time.monotonic())
        found = None
    return found if found is not None else fetch(settings.DATABASE)
