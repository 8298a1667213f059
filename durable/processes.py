"""Celery worker and beat subprocesses, for the test fixtures and the example runner."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


class CeleryProcess:
    """A ``celery`` subprocess in its own process group, so a kill takes its pool children too.

    Every start appends to the same log file; ``wait_ready()`` only looks at what this start wrote.
    """

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, ready_text: str) -> None:
        self.argv, self.env, self.log_path, self.ready_text = argv, env, log_path, ready_text
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    def start(self, timeout: float = 60, *, wait: bool = True) -> CeleryProcess:
        """Spawn the process; with ``wait`` (the default) return once it says it is ready."""
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the subprocess
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        return self.wait_ready(timeout) if wait else self

    def wait_ready(self, timeout: float = 60) -> CeleryProcess:
        """Block until this start's log shows the ready text; raise if the process exits first."""
        assert self.proc is not None, "start() the process first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[:4]} exited with {self.proc.returncode}:\n{self.log()[-3000:]}"
                )
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                if self.ready_text in f.read().decode(errors="replace"):
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"{self.argv[:4]} was not ready within {timeout}s:\n{self.log()[-3000:]}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def send(self, sig: int, *, group: bool = False) -> None:
        """Send ``sig`` to the main process, or with ``group`` to its whole process group (pool
        children included), as systemd stops a unit."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                (os.killpg if group else os.kill)(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to end; its exit code (``subprocess.TimeoutExpired`` past ``timeout``)."""
        assert self.proc is not None, "start() the process first"
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self, timeout: float = 60) -> CeleryProcess:
        """Stop (gracefully) if running, then start again with the same argv, env and log file."""
        self.stop()
        return self.start(timeout)
