"""The example project's production settings: docker-compose.yml's environment passes
``manage.py check --deploy``, and DEBUG off with the development SECRET_KEY refuses to start.

Settings are read at import, so each case runs manage.py in a subprocess with that environment.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# ${NAME}, ${NAME:-default} or ${NAME-default}: compose's interpolation, as used in the file.
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def compose_environment() -> dict[str, str]:
    """The ``environment:`` of the ``x-app`` block every durable service uses, with compose's
    defaults applied as ``docker compose up`` would with nothing set in the shell."""
    lines = (ROOT / "docker-compose.yml").read_text().splitlines()
    block = lines[lines.index("x-app: &app") + 1 :]
    block = block[block.index("  environment:") + 1 :]
    found: dict[str, str] = {}
    for line in block:
        if not line.startswith("    "):
            break  # the next key of x-app
        if line.strip().startswith("#"):
            continue
        key, _, value = line.strip().partition(": ")
        found[key] = _VARIABLE.sub(lambda m: m.group(2) or "", value.strip().strip('"'))
    return found


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_compose_environment_passes_check_deploy() -> None:
    env = compose_environment()
    assert env["DJANGO_DEBUG"] == "0" and env["DJANGO_SECRET_KEY"] == ""  # the secret is the deployer's
    env["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    done = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_debug_off_with_the_development_secret_key_refuses_to_start() -> None:
    env = compose_environment()  # DJANGO_SECRET_KEY left empty, as compose does when it is not set
    done = manage("check", env=env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and "DJANGO_SECRET_KEY" in done.stderr


def test_the_embedded_default_still_runs_with_no_environment(tmp_path: Path) -> None:
    done = manage("check", env={"DURABLE_VAR_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
