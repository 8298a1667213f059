"""A real process death at a chosen crash point, for the end-to-end twin of the crash-point
explorer (tests/crashpoints.py): the points are the explorer's (every SQL statement before it runs,
every commit before and after, every message publish before and after), and at the armed one the
Celery pool process SIGKILLs itself, so what the kernel leaves of a dead worker is what the
engine recovers from.

Armed only by the test's own environment, ``DURABLE_TEST_CRASH_AT="<needle>|<n>|<marker file>"``,
in the workers that import the test module (``--include``): a pool process dies at its ``n``-th
point whose description contains ``needle``. The marker file, created before the kill, makes it
one death for the whole worker (the process Celery forks in its place does not die again) and
records which process died where. The worker's main process and beat never die here: only a
process forked after the arming counts points. With ``n`` 0 nothing dies: every point the pool
processes pass is appended to the marker file instead (how the test's points were chosen).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from tests.crashpoints import wrap_commit

ARM = "DURABLE_TEST_CRASH_AT"


def arm(needle: str, n: int, marker: Path) -> dict[str, str]:
    """The environment that arms a worker to die at the ``n``-th point matching ``needle``."""
    return {ARM: f"{needle}|{n}|{marker}"}


def struck(marker: Path) -> tuple[int, str] | None:
    """The pid that died and the point it died at, once the armed point came."""
    if not marker.exists():
        return None
    pid, _, point = marker.read_text().partition(" ")
    return int(pid), point


class _Armed:
    def __init__(self, needle: str, n: int, marker: Path) -> None:
        self.needle, self.n, self.marker = needle, n, marker
        self.parent = os.getpid()  # the worker's main process imports this before it forks its pool
        self.count = 0
        self.lock = threading.Lock()

    def point(self, what: str) -> None:
        if os.getpid() == self.parent or self.needle not in what:
            return
        if self.n == 0:
            with open(self.marker, "a") as listing:
                listing.write(f"{os.getpid()} {what[:200]}\n")
            return
        with self.lock:
            self.count += 1
            if self.count != self.n:
                return
        # Written whole beside the marker, then linked into place: the test polls the marker and
        # must never read it created but still empty; the link also fails if another process of
        # this worker died first.
        draft = self.marker.with_name(f"{self.marker.name}.{os.getpid()}")
        draft.write_text(f"{os.getpid()} {what[:200]}")
        try:
            os.link(draft, self.marker)
        except FileExistsError:
            return  # another process of this worker died already
        finally:
            draft.unlink()
        os.kill(os.getpid(), signal.SIGKILL)

    def statement(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.point(f"statement {' '.join(sql.split())}")
        return execute(sql, params, many, context)

    def connected(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if getattr(connection, "_durable_crash_armed", False):
            return  # the same wrapper object reconnects: wrapped once
        connection._durable_crash_armed = True
        connection.execute_wrappers.append(self.statement)
        wrap_commit(connection, self.point)

    def install(self) -> None:
        from celery.signals import after_task_publish, before_task_publish
        from django.db.backends.signals import connection_created

        connection_created.connect(self.connected, weak=False)
        before_task_publish.connect(
            lambda sender=None, **kw: self.point(f"before publish {sender}"), weak=False
        )
        after_task_publish.connect(
            lambda sender=None, **kw: self.point(f"after publish {sender}"), weak=False
        )


def arm_from_environment() -> None:
    spec = os.environ.get(ARM)
    if not spec:
        return
    needle, n, marker = spec.split("|")
    _Armed(needle, int(n), Path(marker)).install()
