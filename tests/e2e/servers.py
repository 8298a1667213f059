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

    def copy_of(self, data: Path) -> PostgresServer:
        """This cluster's data directory made a copy of ``data``, a stopped cluster's (owners and
        modes kept, as PostgreSQL wants them), in place of ``init()``."""
        subprocess.run(["cp", "-a", str(data), str(self.data)], check=True, timeout=120)
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

    def replica(self, port: int) -> PostgresServer:
        """A streaming replica of this server (``pg_basebackup -R``), started on ``port``."""
        standby = PostgresServer(self.bindir, port)
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            "-D", str(standby.data), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
        )  # fmt: skip
        standby.start()
        return standby

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


class ForegroundServer:
    """A server process of ours in the foreground, in a temporary directory of its own: started
    and waited for on its port, stopped, and removed whatever state it is in."""

    #: What it is called in errors.
    name = "server"

    def __init__(self, port: int) -> None:
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix=f"durable-{self.name}-"))
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30) -> None:
        with open(self.root / "server.log", "ab") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} on {self.port} did not start: {self.log_tail()}")
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


class RedisServer(ForegroundServer):
    """A ``redis-server`` of its own that keeps nothing across a restart."""

    name = "redis-server"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        return argv + ["--appendonly", "no", "--daemonize", "no", "--dir", str(self.root)]


def pgbouncer_binary() -> str | None:
    """Debian's pgbouncer, if installed (``apt-get install pgbouncer``)."""
    return shutil.which("pgbouncer") or next(
        (str(path) for path in [Path("/usr/sbin/pgbouncer")] if path.exists()), None
    )


class PgBouncer(ForegroundServer):
    """PgBouncer in transaction mode, as shops run it in front of PostgreSQL: a client's server
    connection is its own only for a transaction, so what needs a session (LISTEN, prepared
    statements before PgBouncer 1.21) does not cross it. In front of the PostgreSQL server on
    ``upstream``, every database, trust authentication; run as ``postgres`` when root (it refuses
    root)."""

    name = "pgbouncer"

    def __init__(self, binary: str, upstream: int, port: int) -> None:
        super().__init__(port)
        self.binary, self.upstream = binary, upstream

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def argv(self) -> list[str]:
        ini, users = self.root / "pgbouncer.ini", self.root / "users.txt"
        users.write_text('"postgres" ""\n')
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.upstream}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\n"
            "pool_mode = transaction\nmax_client_conn = 2000\ndefault_pool_size = 40\n"
            # psycopg sends these at connect; a pooler in transaction mode must let them by.
            "ignore_startup_parameters = extra_float_digits,options\n"
            # A server connection idle this long is closed, so a test database can be dropped.
            "server_idle_timeout = 2\n"
            # After a failed login to a restarting server PgBouncer waits this long before the
            # next try, every transaction held meanwhile: 15 s by default (docs/production.md).
            "server_login_retry = 1\n"
        )
        if os.geteuid() != 0:
            return [self.binary, str(ini)]
        for path in (self.root, ini, users):
            shutil.chown(path, "postgres", "postgres")
        return ["runuser", "-u", "postgres", "--", self.binary, str(ini)]


if __name__ == "__main__":
    # python -m tests.e2e.servers pgbouncer PORT UPSTREAM: one in the foreground until killed
    # (CI's pgbouncer suite puts it in front of the shared PostgreSQL this way).
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the finally below stops it
    _, kind, port, upstream = sys.argv
    binary = pgbouncer_binary()
    if kind != "pgbouncer" or binary is None:
        raise SystemExit("usage: python -m tests.e2e.servers pgbouncer PORT UPSTREAM (pgbouncer installed)")
    bouncer = PgBouncer(binary, int(upstream), int(port))
    bouncer.start()
    print(f"pgbouncer on {bouncer.port}, in front of {bouncer.upstream}", flush=True)
    try:
        assert bouncer.process is not None
        bouncer.process.wait()
    finally:
        bouncer.remove()
