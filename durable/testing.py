"""Pytest fixtures for projects that use durable (registered as a pytest plugin).

- ``durable_env``: durable's Celery messages are captured in-process (the env's ``transport``
  is installed for the test); ``run_until_idle()`` runs them, ``advance_time()`` moves a frozen
  clock and runs the sweeps, so timers fire at once.
- ``durable_worker``: a real ``celery worker`` subprocess on the configured broker and the test
  database, for end-to-end tests (with ``start_beat()``, ``kill()`` and ``restart()``), and
  ``add_worker()`` for more workers, each killable and restartable on its own; a test module
  configures it by overriding the ``durable_worker_options`` fixture.
- ``replay_history(history)``: replay an exported history (``manage.py durable show RUN --json``)
  against the workflow code of the test, no database needed; raises ``NonDeterminismError``
  when the code would break the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from . import conf, dispatch
from .durations import parse_duration
from .errors import DurableError
from .processes import CeleryProcess
from .replay import check


class DurableEnv:
    """Runs durable's work in the test process, under a frozen clock."""

    def __init__(self, freezer: Any) -> None:
        self.messages: list[dispatch.Message] = []
        #: The test process as durable sees it: a worker of every queue (a recorded result runs
        #: the next turn inline) that runs no step in place (each step's message stays visible),
        #: whose result() never waits for work nobody runs, with no thread renewing leases under
        #: the frozen clock.
        self.transport = dispatch.Transport(
            send=self.capture, served_queues=None, may_wait=False, keep_alive=False
        )
        self._freezer = freezer
        self._handlers: dict[str, Callable[..., Any]] = {}
        self._broker_down = False
        from django.db import connections

        # How deep the test framework's own atomic blocks go (0 under transactional_db).
        self._test_depth = len(connections[conf.get().DATABASE].atomic_blocks)

    def capture(self, message: dispatch.Message) -> None:
        if self._broker_down:
            raise ConnectionError("broker unreachable (durable_env.broker_down())")
        self.messages.append(message)

    @contextlib.contextmanager
    def broker_down(self) -> Iterator[None]:
        """Make every publish inside the block fail, as an unreachable broker would."""
        self._broker_down = True
        try:
            yield
            self._commit_callbacks()  # what committed inside the block published inside it
        finally:
            self._broker_down = False

    def _run_celery_task(self, message: dispatch.Message) -> None:
        """Run an existing Celery task sent as a step, eagerly, and report it as its link would."""
        from celery import current_app

        from .engine import reported
        from .errors import error_dict

        run_id, seq, attempt, token = message.options["headers"]["durable"]
        if message.task not in current_app.tasks:
            self._run_remote_step(message, run_id, seq, attempt, token)
            return
        result = current_app.tasks[message.task].apply(
            args=message.args, kwargs=message.options.get("kwargs")
        )
        if result.successful():
            reported.step_result(run_id, seq, attempt, output=result.result, token=token)
        else:
            reported.step_result(run_id, seq, attempt, error=error_dict(result.result), token=token)

    def _run_remote_step(
        self, message: dispatch.Message, run_id: str, seq: int, attempt: int, token: str
    ) -> None:
        """Run a remote step here as its worker would: from the message alone, reporting its
        heartbeats and its result as messages (durable.heartbeat, durable.step_result)."""
        from . import codecs, remote
        from .definitions import registry
        from .engine import reported
        from .replay.attempt import run_attempt
        from .replay.stepscope import StepInfo

        step = registry.step(message.task)
        # Opened and sealed under this process's codec, as durable.remote does on a worker.
        payload = remote.arguments(message.args, message.options.get("kwargs", {}))

        def beat(progress: Any = None) -> None:
            sealed = None if progress is None else codecs.sealed(progress, conf.codec())
            reported.heartbeat(run_id, seq, attempt, sealed, token)

        info = StepInfo(run_id, seq, attempt, step.name, secret=token)
        output, error, retryable = run_attempt(step, info, payload, beat)
        if error is not None and not retryable:
            error = {**error, "non_retryable": True}
        output = codecs.sealed(output, conf.codec()) if error is None else None
        reported.step_result(run_id, seq, attempt, output=output, error=error, token=token)

    def _handler(self, task: str) -> Callable[..., Any]:
        if not self._handlers:
            from . import remote
            from .engine import entities, redispatch, remote_turns, reported, steps, turn, wakes
            from .engine.sweeps import SWEEPS

            self._handlers = {
                # A remote turn runs here as its database-less worker would: from the message alone.
                dispatch.REMOTE_TURN: lambda turn: remote.run_turn(turn),
                dispatch.DECISION: lambda **decision: remote_turns.apply(decision),
                dispatch.TURN_HEARTBEAT: remote_turns.heartbeat,
                dispatch.HEARTBEAT: reported.heartbeat,
                dispatch.STEP_RESULT: reported.step_result,
                dispatch.ADVANCE: turn.advance,
                dispatch.ADVANCE_BATCH: wakes.advance_batch,
                dispatch.RUN_STEP: steps.run_step,
                dispatch.APPLY_ENTITY: entities.apply,
                dispatch.PROBE: redispatch.probed,
                **{sweep.task: sweep.run for sweep in SWEEPS},
            }
        return self._handlers[task]

    def _commit_callbacks(self) -> None:
        # Under pytest-django's ``db`` the test never commits, so on-commit callbacks would never
        # run; run those left by transactions that did finish, as their real commit would.
        from django.db import connections

        connection = connections[conf.get().DATABASE]
        # Inside the test's own transaction.atomic(), callbacks wait for its end, as in production.
        if len(connection.atomic_blocks) > self._test_depth:
            return
        while connection.in_atomic_block and connection.run_on_commit:
            _, callback, _ = connection.run_on_commit.pop(0)
            callback()

    def pending(self) -> list[dispatch.Message]:
        """The messages sent and not yet run."""
        self._commit_callbacks()
        return list(self.messages)

    def drop(self, task: str | None = None) -> list[dispatch.Message]:
        """Lose the pending messages (of ``task``, or all), as a broker might; return them."""
        dropped = [m for m in self.pending() if task is None or m.task == task]
        self.messages[:] = [m for m in self.messages if m not in dropped]
        return dropped

    def run_next(self) -> dispatch.Message | None:
        """Run the oldest captured message, if any, and return it."""
        if not self.pending():
            return None
        message = self.messages.pop(0)
        if message.task.startswith("durable."):
            self._handler(message.task)(*message.args, **message.options.get("kwargs", {}))
        else:
            self._run_celery_task(message)
        return message

    def run_until_idle(self, max_tasks: int = 10_000) -> int:
        """Run captured messages, and what they send, until none is left; return how many ran."""
        ran = 0
        while self.pending():
            if ran == max_tasks:
                raise DurableError(
                    f"run_until_idle() ran {max_tasks} tasks and work is still coming: a workflow "
                    "that never settles? Raise max_tasks if this is expected"
                )
            self.run_next()
            ran += 1
        return ran

    def sweep(self) -> int:
        """Run the beat sweeps once, then everything they send."""
        from .engine.sweeps import SWEEPS

        return sum(sweep.run() for sweep in SWEEPS) + self.run_until_idle()

    def advance_time(self, duration: Any) -> int:
        """Move the frozen clock forward in one jump, then fire what became due until idle."""
        delta = parse_duration(duration, what="advance_time()")
        self._freezer.tick(delta)
        ran = self.run_until_idle()
        while True:
            step = self.sweep()
            if not step:
                return ran
            ran += step

    def now(self) -> Any:
        from . import clock

        return clock.now()


@pytest.fixture
def durable_env(request: pytest.FixtureRequest) -> Iterator[DurableEnv]:
    """Capture durable's messages in-process and freeze the clock; see DurableEnv."""
    import freezegun
    from django.utils import timezone

    if not any(name in request.fixturenames for name in ("db", "transactional_db", "django_db_setup")):
        request.getfixturevalue("db")
    from .engine import sweeps

    sweeps.reset_passes()
    freezer = freezegun.freeze_time(timezone.now(), tick=False)
    frozen = freezer.start()
    env = DurableEnv(frozen)
    try:
        with dispatch.using(env.transport):
            yield env
    finally:
        freezer.stop()


@pytest.fixture(autouse=True)
def _durable_result_listeners_closed() -> Iterator[None]:
    """Close the connection ``durable.result()`` listens on after each test: a test database
    that a connection still uses cannot be dropped at the end of the session."""
    yield
    waiting = sys.modules.get("durable.waiting")  # not imported: no listener to close
    if waiting is not None:
        waiting.stop_all()


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


def cut_database_connections() -> int:
    """Terminate every other connection to the test database (PostgreSQL), as a database
    restart would for its clients; return how many. Refuses any database not named test_*."""
    from django.db import connections

    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute("SELECT current_database()")
        (database,) = cursor.fetchone()
        if not database.startswith("test_"):
            raise DurableError(f"refusing to cut the connections of {database!r}: not a test database")
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return sum(1 for (ok,) in cursor.fetchall() if ok)


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

    def stop(self) -> None:
        self.process.stop()

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
    ``restart()`` act on the primary worker; ``close()`` stops them all and beat.
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
        for handle in self.workers:
            handle.stop()
        for beat in self.beats:
            beat.stop()


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


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60,
    interval: float = 0.1,
    what: str = "condition",
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; raise AssertionError past ``timeout``,
    with what ``explain`` says of the state it stopped in."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{said}")
        time.sleep(interval)


def replay_history(history: Any, workflow: Any = None) -> check.Verdict:
    """Replay an exported history against the workflow code installed now, as a deploy would.

    ``history`` is the JSON of ``manage.py durable show RUN --json`` (a dict, a JSON string, or
    a path to a file holding it); ``workflow`` (a ``@durable.workflow``) defaults to the
    registered one the history names. Nothing runs, is sent or is written: the body is walked
    over the recorded positions only. Raises the ``NonDeterminismError`` (or the
    ``WorkflowNotRegistered`` / ``InvalidInput``) that would break the run; returns the verdict.
    """
    from .definitions import registry

    if isinstance(history, Path) or (isinstance(history, str) and not history.lstrip().startswith("{")):
        history = Path(history).read_text()
    if isinstance(history, str):
        history = json.loads(history)
    facts, records, at = check.from_json(history)
    definition = workflow if workflow is not None else registry.workflow(facts.workflow, facts.version)
    verdict = check.check(definition, facts, records, at=at)
    if verdict.error is not None:
        raise verdict.error
    return verdict
