"""Where the benchmarks run: PostgreSQL + Redis set-up, Django in this process, and the worker.

Only the databases ``durable_bench`` / ``dbos_bench`` and Redis db 5 are touched.
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
DURABLE_DB = os.environ.get("BENCH_DB", "durable_bench")
DBOS_DB = os.environ.get("BENCH_DBOS_DB", "dbos_bench")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/5")
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "2"))
QUEUES = "durable,celery"

#: The environment of this process and of the worker: the example project on PostgreSQL + Redis,
#: DEBUG off (Django keeps no query log; with it off the project wants a key of its own), warnings only.
ENV = {
    "DJANGO_SETTINGS_MODULE": os.environ.get("BENCH_SETTINGS", "project.settings"),
    "DATABASE_URL": f"{PG}/{DURABLE_DB}",
    "CELERY_BROKER_URL": REDIS,
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(50),
    "DURABLE_LOG_LEVEL": "WARNING",
}

#: The packages measured, copied at start-up so that the worker and this process run the same
#: code for the whole run even if the work tree changes meanwhile (see ``snapshot()``).
SNAPSHOT_PACKAGES = ("durable", "durable_admin", "project")
snapshot_dir: Path | None = None

#: Tables emptied between repetitions, so every repetition starts from the same state.
TABLES = ("durable_signal", "durable_checkpoint", "durable_run", "django_celery_results_taskresult")


def source_hash(base: Path = ROOT) -> str:
    """Identify the measured code by a hash of its sources (the bench runs no git)."""
    import hashlib

    digest = hashlib.sha256()
    for package in SNAPSHOT_PACKAGES:
        for path in sorted((base / package).rglob("*.py")):
            digest.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def snapshot() -> Path:
    """Copy durable, durable_admin and project to /tmp and put the copy first on the path."""
    import shutil
    import tempfile

    global snapshot_dir
    if os.environ.get("BENCH_SOURCE"):
        # Measure a copy kept from an earlier run (its path is in that run's log), e.g. to profile
        # exactly the code a results table came from.
        target = Path(os.environ["BENCH_SOURCE"]).resolve()
    else:
        target = Path(tempfile.mkdtemp(prefix="durable-bench-src-"))
        for package in SNAPSHOT_PACKAGES:
            shutil.copytree(ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    snapshot_dir = target
    # celery (worker and CLI) and Celery's Django fix-up put the working directory first on
    # sys.path: work from the copy, or a worker would import durable from the live tree.
    os.chdir(target)
    ENV["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(target), str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    sys.path[:0] = [str(target), str(ROOT)]
    return target


def setup() -> None:
    """Snapshot the code, create the databases, point Django at them, migrate, import workloads."""
    if snapshot_dir is None:
        snapshot()
    os.environ.update(ENV)
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        for name in (DURABLE_DB, DBOS_DB):
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import bench.workloads  # noqa: F401
    import project.celery  # noqa: F401 - makes the project's app current_app for durable's sender


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")


def purge_queues() -> None:
    from celery import current_app

    with current_app.connection_for_write() as conn:
        for queue in QUEUES.split(","):
            with contextlib.suppress(Exception):  # a queue not declared yet holds nothing
                conn.default_channel.queue_purge(queue)


def worker_argv(app: str, name: str, concurrency: int, queues: str) -> list[str]:
    """``celery -A app worker``, prefork, quiet, without the chatter between workers."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "--loglevel=WARNING",
        "--pool=prefork",
        f"--concurrency={concurrency}",
        "-Q",
        queues,
        "-n",
        f"{name}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


class Worker:
    """A real ``celery -A project worker`` subprocess (prefork), with its process tree's RSS."""

    def __init__(
        self,
        name: str = "bench",
        concurrency: int = CONCURRENCY,
        wrap: list[str] = (),
        settings: dict[str, str] | None = None,
    ) -> None:
        from durable.processes import CeleryProcess

        RESULTS.mkdir(parents=True, exist_ok=True)
        self.log_path = RESULTS / f"worker-{name}.log"
        self.log_path.write_text("")
        argv = [*wrap, *worker_argv("project", name, concurrency, QUEUES), "--include", "bench.workloads"]
        self.concurrency = concurrency
        # ``settings``: environment the project's settings read (DURABLE_EAGER_STEPS, say).
        self.process = CeleryProcess(argv, {**os.environ, **ENV, **(settings or {})}, self.log_path, "")

    def start(self) -> Worker:
        purge_queues()
        self.process.start(wait=False)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 90) -> None:
        """Ready when it has forked its pool and runs a chain end to end."""
        from bench import workloads

        deadline = time.monotonic() + timeout
        while len(self.children()) < self.concurrency:
            if not self.process.alive or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.process.log()[-3000:]}")
            time.sleep(0.1)
        workloads.celery_chain().apply_async().get(timeout=timeout, interval=0.05)
        where = workloads.where.apply_async().get(timeout=timeout, interval=0.05)
        if snapshot_dir is not None and not all(
            path.startswith(str(snapshot_dir)) for path in where.values()
        ):
            raise RuntimeError(f"the worker imports code from outside the copy {snapshot_dir}: {where}")

    def stop(self) -> None:
        self.process.stop()

    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def children(self) -> list:
        import psutil

        try:
            return psutil.Process(self.pid()).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def rss(self) -> dict:
        """Peak (VmHWM) and current RSS, MiB: the parent, each pool child, and their sum."""
        import psutil

        procs = [psutil.Process(self.pid()), *self.children()]
        peaks, now = [], []
        for proc in procs:
            peaks.append(_vm_hwm(proc.pid) / 1024)
            now.append(proc.memory_info().rss / 2**20)
        return {
            "peak_parent_mib": round(peaks[0], 1),
            "peak_children_mib": [round(p, 1) for p in peaks[1:]],
            "peak_max_child_mib": round(max(peaks[1:], default=0), 1),
            "peak_total_mib": round(sum(peaks), 1),
            "rss_total_mib": round(sum(now), 1),
        }


def _vm_hwm(pid: int) -> int:
    """Peak resident set size of ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def machine() -> dict:
    import psutil

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psycopg

    with psycopg.connect(f"{PG}/postgres") as conn:
        pg = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
    import redis

    info = redis.Redis.from_url(REDIS).info("server")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": psutil.cpu_count(logical=True),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgresql": pg,
        "postgresql_synchronous_commit": sync,
        "redis": info.get("redis_version"),
        "worker": f"celery prefork, concurrency {CONCURRENCY}, queues {QUEUES}",
    }


def versions() -> dict:
    names = [
        "durable",
        "Django",
        "celery",
        "kombu",
        "redis",
        "psycopg",
        "django-celery-results",
        "dbos",
        "SQLAlchemy",
        "psutil",
        "pyinstrument",
        "py-spy",
    ]
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def run_module(module: str, *args: str, timeout: float = 600) -> str:
    """Run ``python -m module args`` with the bench environment; return its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**os.environ, **ENV},
        cwd=snapshot_dir or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def run_meta(source: str, loadavg_start: list[float], started: float, worker_rss: object) -> dict:
    """The facts every results file carries about the run that produced it."""
    return {
        "settings": ENV["DJANGO_SETTINGS_MODULE"],
        "source_hash": source,
        "tree_changed_during_run": source_hash() != source,
        "machine": machine(),
        "versions": versions(),
        "loadavg_start": loadavg_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "total_s": round(time.perf_counter() - started, 1),
        "worker_peak_rss": worker_rss,
    }
