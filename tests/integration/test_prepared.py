"""Prepared statements (the example project's PostgreSQL settings) and a migration that adds a
column while workers keep their connections: a prepared statement whose row type changes fails
("cached plan must not change result type") until its connection closes, so the statements
every step takes name their columns."""

from __future__ import annotations

import pytest
from django.db import connection

import durable

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql" or not connection.settings_dict["OPTIONS"].get("prepare_threshold"),
        reason="prepared statements: PostgreSQL with prepare_threshold set",
    ),
]


@durable.step
def hop(i):
    return i + 1


@durable.workflow(name="tests.prepared.hops")
def hops(ctx, n):
    for _ in range(n):
        n = ctx.step(hop, n)
    return n


def test_a_column_added_under_prepared_statements_changes_nothing(durable_env):
    # Enough runs that every hot statement ran past psycopg's prepare threshold (5): a run's
    # first claim, the record of its last step, the takes and the records with a next turn.
    for _ in range(6):
        run = durable.start(hops, 4)
        durable_env.run_until_idle()
        assert durable.result(run.id) == 8
    # The migration runs elsewhere (its own connection), as a deploy's does.
    _alter("ADD COLUMN added_by_a_migration integer")
    try:
        run = durable.start(hops, 4)
        durable_env.run_until_idle()
        assert durable.result(run.id) == 8
    finally:
        _alter("DROP COLUMN added_by_a_migration")


def _alter(change: str) -> None:
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        password=settings["PASSWORD"],
        host=settings["HOST"],
        port=settings["PORT"],
        autocommit=True,
    ) as other:
        for table in ("durable_run", "durable_checkpoint"):
            other.execute(f"ALTER TABLE {table} {change}")
