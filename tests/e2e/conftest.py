"""Fixtures of the end-to-end tests: servers of a test's own (see ``servers.py``)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import current_app
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings

from durable.testing import settings_env
from tests.conftest import _skip_or_fail, on_postgres
from tests.e2e.servers import (
    PgBouncer,
    PostgresServer,
    RedisServer,
    free_port,
    pgbouncer_binary,
    postgres_bindir,
)


def settings_fixtures(settings: dict[str, str]) -> tuple[Any, Any]:
    """``durable_worker_options, short_lease = settings_fixtures(SETTINGS)`` in a test module:
    its workers and beat get ``settings`` (as DURABLE_<KEY>), and so does the test process."""

    @pytest.fixture
    def durable_worker_options() -> dict[str, Any]:
        return {"env": settings_env(settings)}

    @pytest.fixture(autouse=True)
    def short_lease() -> Iterator[None]:
        with override_settings(DURABLE=settings):
            yield

    return durable_worker_options, short_lease


@pytest.fixture(autouse=True)
def _no_broken_connection() -> None:
    """This process's connections that an earlier test left broken (a cut, a restart behind a
    pooler) are dropped before the next test, as Django drops them when a request starts: one
    test's failure must not fail every test after it in the process."""
    for each in connections.all(initialized_only=True):
        if not each.in_atomic_block:
            each.close_if_unusable_or_obsolete()


#: The test database made on a PostgreSQL server of the test's own.
DATABASE = "test_durable_server_restarts"


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """A folder where step bodies note each execution (a file per run), outliving any worker."""
    path = tmp_path / "ledger"
    path.mkdir()
    return path


@pytest.fixture
def postgres_server(transactional_db) -> Iterator[PostgresServer]:
    """A PostgreSQL cluster of the test's own, migrated, and this process's database pointed at it.

    The worker fixture reads the database name from this process's connection, and the worker's
    DATABASE_URL (see ``durable_worker_options``) names the cluster's port.
    """
    if not on_postgres():
        _skip_or_fail("needs PostgreSQL: set DATABASE_URL=postgres://...")
    bindir = postgres_bindir()
    if bindir is None:
        _skip_or_fail("needs a PostgreSQL server's binaries in /usr/lib/postgresql/*/bin")
    server = PostgresServer(bindir, free_port())
    saved = dict(connection.settings_dict)
    try:
        if _migrated:
            server.copy_of(_migrated[0].data).start()
        else:
            server.init().start()
            server.create_database(DATABASE)
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(server.port), NAME=DATABASE)
        if not _migrated:
            call_command("migrate", verbosity=0, interactive=False)
            connection.close()
            _migrated.append(_keep_migrated(server, bindir))
        yield server
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        server.remove()


#: A stopped cluster holding the migrated test database, made by this process's first
#: ``postgres_server``: the next ones start from a copy of it. initdb and the migrations cost
#: each such test ten to twenty seconds on CI's loaded cores.
_migrated: list[PostgresServer] = []


def _keep_migrated(server: PostgresServer, bindir: Path) -> PostgresServer:
    """Copy ``server``'s freshly migrated cluster aside (stopped for the copy, then started again)."""
    kept = PostgresServer(bindir, 0)
    server.stop()
    kept.copy_of(server.data)
    server.start()
    return kept


@pytest.fixture(scope="session", autouse=True)
def _remove_migrated() -> Iterator[None]:
    yield
    for kept in _migrated:
        shutil.rmtree(kept.root, ignore_errors=True)


def _replica_alias() -> None:
    """The alias ``replica``: a mirror of ``default`` until the ``replica`` fixture points it at a
    replica of the test's own. Known from the start, so a test may name it in
    ``django_db(databases=...)`` (Django refuses an alias a test did not name)."""
    databases = connections.settings
    if "replica" not in databases:
        default = databases["default"]
        databases["replica"] = {**default, "TEST": {**default.get("TEST", {}), "MIRROR": "default"}}


_replica_alias()


@pytest.fixture
def replica(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """A streaming replica of the test's own PostgreSQL, reached through the alias ``replica``
    (what DURABLE["READ_DATABASE"] names). Its replay can be paused and resumed."""
    standby = postgres_server.replica(free_port())
    replica = connections["replica"]
    saved = dict(replica.settings_dict)
    replica.close()
    replica.settings_dict.update(
        HOST="127.0.0.1", PORT=str(standby.port), NAME=connection.settings_dict["NAME"]
    )
    try:
        yield standby
    finally:
        replica.close()
        replica.settings_dict.clear()
        replica.settings_dict.update(saved)
        standby.remove()


@pytest.fixture
def pgbouncer(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test's own PostgreSQL: the worker and beat
    reach the database through it (prepared statements off, as behind any pooler in transaction
    mode) and listen for runs' ends on a direct connection (``DURABLE["LISTEN_DATABASE"]``)."""
    binary = pgbouncer_binary()
    if binary is None:
        _skip_or_fail("needs pgbouncer (apt-get install pgbouncer)")
    bouncer = PgBouncer(binary, postgres_server.port, free_port())
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.remove()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test's own, and this process's Celery app publishing to it."""
    if shutil.which("redis-server") is None:
        _skip_or_fail("needs redis-server on the PATH")
    server = RedisServer(free_port())
    try:
        server.start()
        with celery_broker(server.url):
            yield server
    finally:
        server.remove()


@contextlib.contextmanager
def celery_broker(url: str) -> Iterator[None]:
    """Publish this process's messages to ``url``: the app's connection pools are rebuilt."""
    conf = current_app.conf
    saved = conf.broker_url, conf.broker_transport, conf.broker_transport_options

    def drop_pools() -> None:
        # kombu keeps the pools by broker URL: the app looks its own up again at its next publish.
        current_app._pool = None
        current_app.amqp._producer_pool = None

    drop_pools()
    # The embedded default names its transport apart from the URL: Redis's is the URL's.
    conf.broker_url, conf.broker_transport, conf.broker_transport_options = (
        url,
        None,
        {"visibility_timeout": 3600},
    )
    try:
        yield
    finally:
        drop_pools()
        conf.broker_url, conf.broker_transport, conf.broker_transport_options = saved


def servers_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment that points a worker and beat at the servers of the test's own it uses."""
    env = {}
    if "postgres_server" in request.fixturenames:
        env["DATABASE_URL"] = request.getfixturevalue("postgres_server").url("postgres")
    if "pgbouncer" in request.fixturenames:
        env["DATABASE_LISTEN_URL"] = env["DATABASE_URL"]
        env["DATABASE_URL"] = request.getfixturevalue("pgbouncer").url("postgres")
        env["DATABASE_PREPARED_STATEMENTS"] = "0"
    if "redis_server" in request.fixturenames:
        env["CELERY_BROKER_URL"] = request.getfixturevalue("redis_server").url
    return env
