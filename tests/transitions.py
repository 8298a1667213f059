"""The transition tables of ``durable/statuses.py`` as triggers in the test database: a statement
that moves a run or a recorded position between two statuses the tables do not name fails, in
every test and every worker the tests start, whatever wrote it (the ORM, raw SQL, a CASE).

A test that forges a state on purpose (a run left ``running`` by a turn that "died") does so
inside ``forging()``, which the triggers let through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connections

from durable.models import Checkpoint, Run
from durable.statuses import CHECKPOINT_MOVES, RUN_MOVES

#: What each table's rows may do, by table.
GUARDED = ((Run, RUN_MOVES), (Checkpoint, CHECKPOINT_MOVES))
#: Where ``forging()`` leaves its mark on SQLite, which has no session settings.
FORGING_TABLE = "durable_test_forging"


def _allowed(moves: dict[Any, Any]) -> str:
    return ", ".join(f"'{before}>{after}'" for before, after in sorted(moves))


def install(alias: str = "default") -> None:
    """Create (or replace) the triggers on ``alias``'s database."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        for model, moves in GUARDED:
            table = model._meta.db_table
            refused = f"{table} moved a row between statuses durable/statuses.py does not name"
            moved = f"(OLD.status || '>' || NEW.status) NOT IN ({_allowed(moves)})"
            if connection.vendor == "postgresql":
                cursor.execute(
                    f"CREATE OR REPLACE FUNCTION {table}_moves() RETURNS trigger AS $$ BEGIN "
                    f"IF OLD.status <> NEW.status AND {moved} "
                    "AND coalesce(current_setting('durable.forging', true), '') <> 'on' THEN "
                    f"RAISE EXCEPTION '{refused}: % to %', OLD.status, NEW.status "
                    "USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
                )
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_moves ON {table}")
                cursor.execute(
                    f"CREATE TRIGGER {table}_moves BEFORE UPDATE OF status ON {table} "
                    f"FOR EACH ROW EXECUTE FUNCTION {table}_moves()"
                )
            elif connection.vendor == "sqlite":
                cursor.execute(f"CREATE TABLE IF NOT EXISTS {FORGING_TABLE} (on_ integer)")
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_moves")
                cursor.execute(
                    f"CREATE TRIGGER {table}_moves BEFORE UPDATE OF status ON {table} "
                    f"WHEN OLD.status <> NEW.status AND {moved} "
                    f"AND NOT EXISTS (SELECT 1 FROM {FORGING_TABLE}) "
                    f"BEGIN SELECT RAISE(ABORT, '{refused}'); END"
                )


@contextlib.contextmanager
def forging(alias: str = "default") -> Iterator[None]:
    """Let a test write any status, to forge a state no statement of durable's would leave."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT set_config('durable.forging', 'on', false)")
        else:
            cursor.execute(f"INSERT INTO {FORGING_TABLE} VALUES (1)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT set_config('durable.forging', '', false)")
            else:
                cursor.execute(f"DELETE FROM {FORGING_TABLE}")
