"""Fixtures of the end-to-end tests: servers of a test's own (see ``servers.py``)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import current_app
from django.core.management import call_command
from django.db import connection

from tests.conftest import _skip_or_fail, on_postgres
from tests.e2e.servers import PostgresServer, RedisServer, free_port, postgres_bindir

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
        server.init().start()
        server.create_database(DATABASE)
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(server.port), NAME=DATABASE)
        call_command("migrate", verbosity=0, interactive=False)
        yield server
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        server.remove()


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
    if "redis_server" in request.fixturenames:
        env["CELERY_BROKER_URL"] = request.getfixturevalue("redis_server").url
    return env
