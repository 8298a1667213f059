"""The indexes durable's tables carry on PostgreSQL: each serves a query, none is dead weight."""

from __future__ import annotations

from django.db import connection


def test_no_pattern_index_weighs_on_durable_writes(postgres, db) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename LIKE 'durable\\_%%' AND indexname LIKE '%%\\_like'"
        )
        assert cursor.fetchall() == []


def test_retention_reads_finished_roots_through_their_own_index(postgres, db) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'durable_run_root_finished'")
        (definition,) = cursor.fetchone()
    assert "(finished_at, id)" in definition and "parent_id IS NULL" in definition
