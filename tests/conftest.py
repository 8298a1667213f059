"""Shared test set-up: which services this run has, and workflows the tests define."""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from django.db import connection

REQUIRE_SERVICES = os.environ.get("DURABLE_REQUIRE_SERVICES") == "1"


def _skip_or_fail(reason: str) -> None:
    # In CI a missing service must fail the run, never skip silently.
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (DURABLE_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


def on_redis() -> bool:
    return settings.CELERY_BROKER_URL.startswith("redis")


def on_rabbitmq() -> bool:
    return settings.CELERY_BROKER_URL.startswith(("amqp", "pyamqp"))


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database, every move of a run's or a position's status guarded by the tables
    of durable/statuses.py (``tests/transitions.py``)."""
    from tests import transitions

    with django_db_blocker.unblock():
        transitions.install()


@pytest.fixture
def postgres() -> None:
    """Skip (or fail in CI) unless the suite runs on PostgreSQL."""
    if not on_postgres():
        _skip_or_fail("needs PostgreSQL: set DATABASE_URL=postgres://...")


@pytest.fixture
def redis_broker() -> None:
    """Skip (or fail in CI) unless the broker is Redis."""
    if not on_redis():
        _skip_or_fail("needs Redis: set CELERY_BROKER_URL=redis://...")


@pytest.fixture
def rabbitmq_broker() -> None:
    """Skip unless the broker is RabbitMQ, even in CI: the suites on Redis and on the embedded
    default run these files too, and CI's RabbitMQ suite runs them on amqp://."""
    if not on_rabbitmq():
        pytest.skip("needs RabbitMQ: set CELERY_BROKER_URL=amqp://... (CI's rabbitmq suite does)")


@pytest.fixture
def server_broker() -> None:
    """Skip (or fail in CI) unless the broker is a server the suite can wipe and cut: Redis or
    RabbitMQ (not the embedded filesystem transport)."""
    if not (on_redis() or on_rabbitmq()):
        _skip_or_fail("needs a broker server: set CELERY_BROKER_URL=redis://... or amqp://...")
