"""Real Celery workers (and beat) for end-to-end tests: the ``durable_worker`` fixture, the
handles that kill and restart them, and the faults a test injects around them (a database's
connections cut, a broker flushed)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .. import conf
from ..errors import DurableError
from ..processes import CeleryProcess


def _children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after it.
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def cut_database_connections(settle: float = 5.0) -> int:
    """Terminate every other connection to the test database (PostgreSQL), as a database
    restart would for its clients; return how many. Refuses any database not named test_*.

    Returns once the terminated backends have exited (``DurableError`` if one is still there
    after ``settle`` seconds):
    ``pg_terminate_backend`` only signals them, and behind PgBouncer a server connection still
    dying was handed to this process's next statement, which failed (``terminating connection
    due to administrator command``). The wait is one transaction, so a pooler keeps it on this
    connection's own server session."""
    from django.db import connections, transaction

    alias = conf.get().DATABASE
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT current_database()")
        (database,) = cursor.fetchone()
        if not database.startswith("test_"):
            raise DurableError(f"refusing to cut the connections of {database!r}: not a test database")
        cursor.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        cut = [pid for pid, ok in cursor.fetchall() if ok]
        deadline = time.monotonic() + settle
        while cut:
            # pg_stat_activity is read once per transaction unless its snapshot is cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [cut])
            if not cursor.fetchone()[0]:
                break
            if time.monotonic() > deadline:
                raise DurableError(f"{len(cut)} terminated backend(s) still there after {settle} s")
            time.sleep(0.005)
        return len(cut)


def flush_broker(queues: list[str]) -> str:
    """Lose the messages waiting on the broker, as a broker restart without persistence does;
    say what was done.

    Redis: FLUSHDB its database, or, on db 0 (shared by convention), only kombu's keys and
    ``queues`` (messages a worker holds unacknowledged go too). RabbitMQ: purge ``queues``
    through kombu (a message a worker holds unacknowledged stays with it: RabbitMQ purges only
    the ready ones)."""
    from django.conf import settings

    url = str(settings.CELERY_BROKER_URL)
    if url.startswith(("redis://", "rediss://")):
        return _flush_redis(url, queues)
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        purged, found = _purge(queues)
        return f"purged {purged} messages from {found} queue(s)"
    raise DurableError(
        f"flush_broker() wipes Redis or RabbitMQ, not {url.partition(':')[0]!r}: run the test "
        "with CELERY_BROKER_URL=redis://... or amqp://..."
    )


def _flush_redis(url: str, queues: list[str]) -> str:
    import redis

    client = redis.Redis.from_url(url)
    if client.connection_pool.connection_kwargs.get("db", 0) != 0:
        client.flushdb()
        return "FLUSHDB"
    patterns = ["_kombu.*", "unacked*", *(f"{q}*" for q in queues)]
    keys = {key for pattern in patterns for key in client.scan_iter(pattern)}
    if keys:
        client.delete(*keys)
    return f"deleted {len(keys)} kombu keys of db 0"


class WorkerHandle:
    """One ``celery worker`` process of a DurableWorker: its own ``-n`` name, env and log file.

    The name (and so the log file and any ``DURABLE_INSTANCE_ID`` in its env) stays the same
    across kills and restarts, as a worker restarted by a supervisor keeps its identity.
    """

    def __init__(self, name: str, process: CeleryProcess) -> None:
        self.name, self.process = name, process
        self.kills = 0
        self.restarts = 0

    @property
    def env(self) -> dict[str, str]:
        return self.process.env

    @property
    def alive(self) -> bool:
        return self.process.alive

    def start(self, timeout: float = 60, *, wait: bool = True) -> WorkerHandle:
        self.process.start(timeout, wait=wait)
        return self

    def wait_ready(self, timeout: float = 60) -> WorkerHandle:
        self.process.wait_ready(timeout)
        return self

    def kill(self) -> None:
        """SIGKILL the worker and its pool children, as an OOM kill or a lost node would."""
        self.kills += 1
        self.process.kill()

    def pool_pids(self) -> list[int]:
        """The worker's prefork pool children (read from /proc, so Linux only)."""
        proc = self.process.proc
        return _children(proc.pid) if proc is not None and self.alive else []

    def kill_pool_child(self, pid: int | None = None) -> int | None:
        """SIGKILL one pool child (``pid``, else the first), as the OOM killer would; the worker's
        main process lives on, replaces the child and requeues its message. The pid, or None if
        the worker had no child right then."""
        children = self.pool_pids()
        victim = pid if pid is not None else (children[0] if children else None)
        if victim is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        return victim

    def stop(self, timeout: float = 20) -> None:
        """A warm shutdown (SIGTERM to its process group); killed if it has not ended in ``timeout``
        seconds."""
        self.process.stop(timeout)

    def signal(self, sig: int, *, group: bool = False) -> None:
        """Send ``sig`` to the worker's main process (a warm shutdown for SIGTERM, a cold one for
        SIGQUIT), or with ``group`` to every process of it, as ``systemctl stop`` does."""
        self.process.send(sig, group=group)

    def restart(self, timeout: float = 60) -> WorkerHandle:
        """Start it again (stopping it first if it still runs), same name, env and log file."""
        self.restarts += 1
        self.process.restart(timeout)
        return self

    def logs(self) -> str:
        return self.process.log()

    def __repr__(self) -> str:
        return f"<WorkerHandle {self.name} {'alive' if self.alive else 'down'}>"


#: The Celery execution pools a test worker may run (gevent needs the gevent package).
POOLS = ("prefork", "threads", "solo", "gevent")


class DurableWorker:
    """Real workers (and optionally beat) on the configured broker and the test database.

    The fixture starts one worker (``primary``); ``add_worker()`` starts more, each its own
    process with its own ``-n`` name, log file and environment overrides. ``kill()``,
    ``restart()`` act on the primary worker; ``close()`` (the fixture's teardown) kills them all
    and beat.
    """

    def __init__(
        self,
        app_name: str,
        workdir: Path,
        env: dict[str, str],
        queues: list[str],
        include: list[str],
        concurrency: int = 2,
    ) -> None:
        self.app_name, self.workdir, self.env, self.queues = app_name, workdir, env, queues
        self.include, self.concurrency = include, concurrency
        self.workers: list[WorkerHandle] = []
        self.primary = self._handle("worker", {}, concurrency)
        self.beat: CeleryProcess | None = None
        self.beats: list[CeleryProcess] = []

    @property
    def worker(self) -> CeleryProcess:
        """The primary worker's process (kept for code written before ``add_worker``)."""
        return self.primary.process

    def _handle(
        self,
        name: str,
        env_overrides: dict[str, str],
        concurrency: int,
        queues: list[str] | None = None,
        pool: str = "prefork",
    ) -> WorkerHandle:
        if any(w.name == name for w in self.workers):
            raise ValueError(f"a worker named {name!r} already exists")
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app_name,
            "worker",
            "--loglevel=INFO",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            "-Q",
            ",".join(queues or self.queues),
            "-n",
            f"durable-test-{os.getpid()}-{name}@%h",
            "--without-gossip",
            "--without-mingle",
        ]
        if self.include:
            # The test module defines its workflows; the worker must import it to know them.
            argv += ["--include", ",".join(self.include)]
        env = {**self.env, **env_overrides}
        handle = WorkerHandle(name, CeleryProcess(argv, env, self.workdir / f"{name}.log", "ready."))
        self.workers.append(handle)
        return handle

    def add_worker(
        self,
        env_overrides: dict[str, str] | None = None,
        *,
        name: str | None = None,
        concurrency: int | None = None,
        queues: list[str] | None = None,
        start: bool = True,
        wait: bool = True,
        pool: str = "prefork",
    ) -> WorkerHandle:
        """Start one more worker process and return its handle.

        ``env_overrides`` are added to the fixture's environment for this process only (e.g.
        ``{"DURABLE_INSTANCE_ID": "w2", "DURABLE_LEASE": "3s"}``). With ``wait=False`` it returns
        once spawned; call ``handle.wait_ready()`` (several workers then boot in parallel).
        ``queues`` replaces the queues it consumes (e.g. a namespace's ``["durable@tenant-a"]``).
        ``pool``: Celery's execution pool (``prefork``, ``threads``, ``solo``, ``gevent``).
        """
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
        name = name or f"worker{len(self.workers) + 1}"
        handle = self._handle(name, dict(env_overrides or {}), concurrency or self.concurrency, queues, pool)
        return handle.start(wait=wait) if start else handle

    def start_beat(self, env_overrides: dict[str, str] | None = None, *, name: str = "beat") -> CeleryProcess:
        """Start a ``celery beat``; several may run, each with its own ``name`` (the first is
        ``self.beat``)."""
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app_name,
            "beat",
            "--loglevel=INFO",
            "-s",
            str(self.workdir / f"{name}-schedule"),
            "--pidfile=",
        ]
        env = {**self.env, **(env_overrides or {})}
        beat = CeleryProcess(argv, env, self.workdir / f"{name}.log", "beat: Starting")
        self.beats.append(beat)
        self.beat = self.beat or beat
        return beat.start()

    def kill(self) -> None:
        """SIGKILL the primary worker and its pool children, as an OOM kill or a lost node would."""
        self.primary.kill()

    def restart(self) -> None:
        self.primary.restart()

    def logs(self) -> str:
        """Every worker's log (in the order they were added), then beat's."""
        return "".join(w.logs() for w in self.workers) + "".join(beat.log() for beat in self.beats)

    def close(self) -> None:
        """Kill every worker and beat: a test's workers leave nothing the next test reads (its
        database is emptied, the broker purged when the next fixture starts), and a warm shutdown
        costs seconds a worker (a prefork pool signalled as a group can hang until killed)."""
        for process in [handle.process for handle in self.workers] + self.beats:
            process.send(signal.SIGKILL, group=True)
        for process in [handle.process for handle in self.workers] + self.beats:
            process.kill()


def _purge(queues: list[str]) -> tuple[int, int]:
    """Purge ``queues``; return how many messages went and how many of the queues existed."""
    from celery import current_app

    purged = found = 0
    with current_app.connection_for_write() as connection:
        for queue in queues:
            # A channel each: on RabbitMQ, purging a queue that does not exist yet (it holds
            # nothing) closes the channel it was asked on.
            with contextlib.suppress(Exception), connection.channel() as channel:
                purged += channel.queue_purge(queue) or 0
                found += 1
    return purged, found


@pytest.fixture
def durable_worker_options() -> dict[str, Any]:
    """Override in a test module to configure ``durable_worker``: ``env`` (dict) is added to every
    worker's and beat's environment; ``start=False`` leaves the primary worker unstarted."""
    return {}


@pytest.fixture
def durable_worker(request: pytest.FixtureRequest) -> Iterator[DurableWorker]:
    """A running ``celery worker`` subprocess serving durable's queues on the test database."""
    from celery import current_app
    from django.db import connections

    request.getfixturevalue("transactional_db")
    settings = conf.get()
    queues = sorted({settings.DEFAULT_QUEUE, "celery", *getattr(request, "param", ())})
    _purge(queues)
    env = dict(os.environ)
    env["DURABLE_TEST_DATABASE_NAME"] = str(connections[settings.DATABASE].settings_dict["NAME"])
    env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", ""))
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
    app_name = os.environ.get("DURABLE_TEST_CELERY_APP") or current_app.main or "project"
    workdir = Path(tempfile.mkdtemp(prefix="durable-worker-"))
    include = [request.module.__name__] if request.module is not None else []
    options = request.getfixturevalue("durable_worker_options")
    env.update(options.get("env", {}))
    worker = DurableWorker(app_name, workdir, env, queues, include)
    if options.get("start", True):
        worker.primary.start()
    try:
        yield worker
    finally:
        worker.close()


def settings_env(settings: dict[str, Any]) -> dict[str, str]:
    """``DURABLE`` settings as the environment a worker's settings module reads them from
    (``DURABLE_<KEY>``), so a worker subprocess runs with the test's own intervals."""
    return {f"DURABLE_{key}": str(value) for key, value in settings.items()}
