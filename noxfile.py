"""The supported versions, tested: one nox session per suite and pair of Python and Django (and
the lowest Celery pyproject.toml accepts). docs/development.md says how to run them; .ci/matrix
says which of them CI runs.

Each pair installs requirements.txt with the lines of its file in .ci/constraints/ in place of
requirements.txt's own for the same names, so the test tools and every other pin are the primary
pair's and only what the pair is about differs.

The integration and end-to-end sessions need PostgreSQL and Redis of the caller's own:
DATABASE_URL and CELERY_BROKER_URL must be set (a session refuses to start without them rather
than run on the embedded default and claim a PostgreSQL result).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ROOT / ".ci" / "constraints"

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
# Nothing runs by default: each session costs minutes, so the caller names the ones wanted.
nox.options.sessions = []

# name: (python, overrides file or None for requirements.txt as it is)
PAIRS = {
    "py311-django52": ("3.11", None),
    "py313-django61": ("3.13", "py313-django61.txt"),
    "py311-celery54": ("3.11", "py311-celery54.txt"),
}

# The integration tests CI runs on the secondary pairs (the whole integration suite takes about
# 10 CPU-minutes a pair; `integration-*` runs it). Chosen for what a Django, Python or Celery
# release could break: the models, migrations and query shapes, the admin and its templates, the
# system checks, the connections, storages and async ORM, the Celery tasks, signals and time
# limits, JSON and values, schedules, and the engine's claim and record path.
INTEGRATION_SUBSET = [
    "tests/integration/test_migrations.py",
    "tests/integration/test_indexes.py",
    "tests/integration/test_queries.py",
    "tests/integration/test_checks.py",
    "tests/integration/test_admin.py",
    "tests/integration/test_admin_console.py",
    "tests/integration/test_admin_payloads.py",
    "tests/integration/test_console.py",
    "tests/integration/test_connections.py",
    "tests/integration/test_offload.py",
    "tests/integration/test_hello_async.py",
    "tests/integration/test_async_client.py",
    "tests/integration/test_async_steps.py",
    "tests/integration/test_celery_tasks.py",
    "tests/integration/test_recovery.py",
    "tests/integration/test_lifecycle_signals.py",
    "tests/integration/test_step_time_limits.py",
    "tests/integration/test_values.py",
    "tests/integration/test_schedules.py",
    "tests/integration/test_record_and_claim.py",
    "tests/integration/test_api.py",
    "tests/integration/test_engine.py",
    "tests/integration/test_deploy.py",
]

# Never installed into a session: the session runner itself.
NOT_IN_SESSIONS = {"nox"}

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _name(line: str) -> str | None:
    """The normalized distribution name a requirements line pins, or None for comments, blank
    lines and options (-e ., -r ...)."""
    stripped = line.strip()
    if not stripped or stripped.startswith(("#", "-")):
        return None
    match = _NAME.match(stripped)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else None


def _requirements(session: nox.Session, overrides: str | None) -> Path:
    """requirements.txt with the pair's lines in place of its own for the same names, written
    into the session's temporary directory."""
    base = (ROOT / "requirements.txt").read_text().splitlines()
    pair = (CONSTRAINTS / overrides).read_text().splitlines() if overrides else []
    replaced = {name for name in map(_name, pair) if name}
    unknown = replaced - {_name(line) for line in base}
    if unknown:
        session.error(f"{overrides} pins {sorted(unknown)}, which requirements.txt does not list")
    kept = [line for line in base if _name(line) not in replaced | NOT_IN_SESSIONS]
    merged = Path(session.create_tmp()) / "requirements.txt"
    merged.write_text("\n".join(kept + [line for line in pair if _name(line)]) + "\n")
    return merged


def _install(session: nox.Session, overrides: str | None) -> None:
    session.install("-q", "-r", str(_requirements(session, overrides)))
    session.run("python", "-m", "pip", "check", silent=True)
    session.run("python", "-c", _VERSIONS)


# Printed first in each session's log, so a result says which versions it is a result for.
_VERSIONS = (
    "import sys, django, celery, kombu; "
    "print('python', sys.version.split()[0], 'django', django.__version__, "
    "'celery', celery.__version__, 'kombu', kombu.__version__)"
)


def _services(session: nox.Session) -> dict[str, str]:
    """The environment of a run on PostgreSQL and Redis: the caller's own database and Redis
    database, and a missing service fails rather than skips."""
    url = os.environ.get("DATABASE_URL", "")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not broker.startswith("redis://"):
        session.error(
            "set DATABASE_URL=postgres://... and CELERY_BROKER_URL=redis://... to a database and "
            "a Redis database of your own: this session runs on PostgreSQL and Redis"
        )
    var = Path(session.create_tmp()) / "var"
    return {"DURABLE_REQUIRE_SERVICES": "1", "DURABLE_VAR_DIR": str(var)}


def _pytest(session: nox.Session, paths: list[str], env: dict[str, str] | None = None) -> None:
    session.run("pytest", "-p", "no:cacheprovider", "-q", *paths, *session.posargs, env=env or {})


for _pair, (_python, _overrides) in PAIRS.items():

    def _make(pair: str, python: str, overrides: str | None) -> None:
        @nox.session(name=f"unit-{pair}", python=python)
        def unit(session: nox.Session) -> None:
            """The unit tests (the pure core; no services)."""
            _install(session, overrides)
            _pytest(session, ["tests/unit"])

        @nox.session(name=f"ci-{pair}", python=python)
        def ci(session: nox.Session) -> None:
            """What CI runs on this pair: the unit tests and the integration subset, on
            PostgreSQL and Redis."""
            _install(session, overrides)
            _pytest(session, ["tests/unit", *INTEGRATION_SUBSET], _services(session))

        @nox.session(name=f"integration-{pair}", python=python)
        def integration(session: nox.Session) -> None:
            """The whole integration suite on PostgreSQL and Redis (a release check)."""
            _install(session, overrides)
            _pytest(session, ["tests/integration"], _services(session))

        @nox.session(name=f"full-{pair}", python=python)
        def full(session: nox.Session) -> None:
            """Every test: unit, integration, browser and end-to-end, on PostgreSQL and Redis."""
            _install(session, overrides)
            _pytest(session, ["tests"], _services(session))

    _make(_pair, _python, _overrides)
