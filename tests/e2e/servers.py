"""PostgreSQL and Redis servers of a test's own, on free ports, to restart and stop at will.

The shared servers (5432, 6379) are never touched: each server here lives in a temporary
directory that ``remove()`` deletes, whatever state the server is in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postgres_bindir() -> Path | None:
    """The newest installed PostgreSQL server's bin directory (Debian's layout), if any."""
    found = [d for d in Path("/usr/lib/postgresql").glob("*/bin") if (d / "initdb").exists()]
    return max(found, key=lambda d: int(d.parent.name)) if found else None


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class PostgresServer:
    """A PostgreSQL cluster of its own: ``initdb`` into a temporary directory, ``pg_ctl`` for the rest.

    PostgreSQL refuses to run as root, so as root every command runs as the ``postgres`` user.
    """

    def __init__(self, bindir: Path, port: int) -> None:
        self.bindir, self.port = bindir, port
        self.root = Path(tempfile.mkdtemp(prefix="durable-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(argv[:3])} failed: {done.stderr or done.stdout}{self.tail()}")
        return done

    def tail(self) -> str:
        return f"\n--- server log ---\n{self.log.read_text()[-2000:]}" if self.log.exists() else ""

    def init(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        return self

    def _ctl(self, *argv: str) -> None:
        # Its own socket directory and TCP on 127.0.0.1 only; fsync off, as nothing here outlives it.
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, *argv)

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """Stop (fast: sessions are ended, as for a minor upgrade) and start again."""
        self._ctl("restart", "-m", "fast")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "stop", "-m", mode)

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def remove(self) -> None:
        """Stop it whatever it is doing and delete its directory."""
        if (self.data / "postmaster.pid").exists():
            self._run(
                "pg_ctl", "-D", str(self.data), "-w", "-t", "30", "stop", "-m", "immediate", check=False
            )
        shutil.rmtree(self.root, ignore_errors=True)


class RedisServer:
    """A ``redis-server`` of its own, in the foreground, that keeps nothing across a restart."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="durable-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--daemonize", "no", "--dir", str(self.root)]
        with open(self.root / "server.log", "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start: {self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text()[-2000:]
        return ""

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
