"""Turning the run and checkpoint tables into tables partitioned by run id on PostgreSQL, and back.

Forward, nothing is copied: each table as it stands becomes the DEFAULT partition of a new
partitioned table of the same name, with the same columns, defaults, checks and indexes (PostgreSQL
adopts the old indexes, renamed ``*_pdefault``, instead of building them again). What has to
change around them:

- the checkpoint table's primary key becomes ``(id, run_id)`` (a key unique across partitions
  must hold the partition key); its index is built CONCURRENTLY beforehand, so the conversion's
  exclusive lock lasts for catalogue changes only;
- the run table's foreign keys to itself (``parent``, ``continued_from``) move to the new table and
  are checked once more while it attaches its old rows (a scan of the old runs, seconds for ten
  million);
- the other tables' foreign keys to runs point at the new table, added NOT VALID under the lock,
  validated after it without blocking writes;
- the checkpoint table's foreign key to runs stays between the two default partitions: each
  partition of positions refers to the partition of its runs (``durable.models.partitions``).

Then the days ahead are made (``partitions.ensure_ahead``). Backward, the day partitions' rows go
back into the default partitions, which become the tables again.

A later migration that builds an index on one of these tables CONCURRENTLY must build it on each
partition (PostgreSQL refuses CONCURRENTLY on a partitioned table): ``ON ONLY`` the parent, then
concurrently on each partition, then attached.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..models import partitions

RUNS, HISTORY = partitions.RUNS, partitions.HISTORY
DEFAULT = "_pdefault"
#: The unique index that becomes the old checkpoint table's primary key as a partition.
HISTORY_KEY = f"{HISTORY}_key{DEFAULT}"


def partition(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or partitions.is_partitioned(connection.alias):
        return
    with connection.cursor() as cursor:
        # Left invalid by an earlier try cut short, if at all.
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {HISTORY_KEY}")
        cursor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {HISTORY_KEY} ON {HISTORY} (id, run_id)")
        with transaction.atomic(using=connection.alias):
            cursor.execute(f"LOCK TABLE {RUNS}, {HISTORY} IN ACCESS EXCLUSIVE MODE")
            # Every key to runs but the positions' (it stays, between the default partitions).
            referring = _foreign_keys(
                cursor, f"confrelid = '{RUNS}'::regclass AND conrelid <> '{HISTORY}'::regclass"
            )
            for table, name, _ in referring:
                cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            triggers = _triggers(cursor)
            for table, name, _ in triggers:
                cursor.execute(f'DROP TRIGGER "{name}" ON {table}')
            for table in (RUNS, HISTORY):
                _set_aside(cursor, table)
            cursor.execute(f"ALTER TABLE {HISTORY}{DEFAULT} DROP CONSTRAINT {HISTORY}_pkey{DEFAULT}")
            cursor.execute(
                f"ALTER TABLE {HISTORY}{DEFAULT} ADD CONSTRAINT {HISTORY_KEY} PRIMARY KEY USING INDEX {HISTORY_KEY}"
            )
            _create_parent(cursor, RUNS, "id", "")
            _create_parent(cursor, HISTORY, "run_id", " INCLUDING IDENTITY")
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{HISTORY}', 'id'), last_value, is_called) "
                f"FROM {_sequence(cursor, HISTORY + DEFAULT)}"
            )
            for table, name, definition in referring:
                # The run table's keys to itself: added while it has no partition, checked as its
                # old rows attach.
                valid = "" if table == RUNS else " NOT VALID"
                cursor.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}{valid}')
            for _, _, definition in triggers:
                cursor.execute(definition)  # on the new table, and so on each of its partitions
            for table in (RUNS, HISTORY):
                cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {table}{DEFAULT} DEFAULT")
        for table, name, _ in referring:
            if table != RUNS:
                cursor.execute(f'ALTER TABLE {table} VALIDATE CONSTRAINT "{name}"')


def unpartition(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if not partitions.is_partitioned(connection.alias):
        return
    with connection.cursor() as cursor, transaction.atomic(using=connection.alias):
        cursor.execute(f"LOCK TABLE {RUNS}, {HISTORY} IN ACCESS EXCLUSIVE MODE")
        # First, so that detaching a day checks no row elsewhere for its runs.
        referring = _foreign_keys(cursor, f"confrelid = '{RUNS}'::regclass AND conparentid = 0")
        for table, name, _ in referring:
            cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for day in partitions.days(connection.alias):
            for table in (HISTORY, RUNS):
                cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {table}{day.suffix}")
            for table in (RUNS, HISTORY):
                cursor.execute(f"INSERT INTO {table}{DEFAULT} SELECT * FROM {table}{day.suffix}")
            for table in (HISTORY, RUNS):
                cursor.execute(f"DROP TABLE {table}{day.suffix}")
        # The moved rows' deferred checks, run now: PostgreSQL alters no table that has some pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            f"SELECT setval('{_sequence(cursor, HISTORY + DEFAULT)}', last_value, is_called) "
            f"FROM {_sequence(cursor, HISTORY)}"
        )
        indexes = {table: _indexes(cursor, table) for table in (RUNS, HISTORY)}
        triggers = _triggers(cursor)
        for table in (HISTORY, RUNS):
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {table}{DEFAULT}")
            cursor.execute(f"DROP TABLE {table}")
            cursor.execute(f"ALTER TABLE {table}{DEFAULT} RENAME TO {table}")
            for name in indexes[table]:
                cursor.execute(f"ALTER INDEX IF EXISTS {name}{DEFAULT} RENAME TO {name}")
        for table, name, definition in triggers:
            # A clone the partition kept as it was detached, if the server keeps them.
            cursor.execute(f'DROP TRIGGER IF EXISTS "{name}" ON {table}')
            cursor.execute(definition)
        cursor.execute(f"ALTER TABLE {HISTORY} DROP CONSTRAINT {HISTORY_KEY}")
        cursor.execute(f"ALTER TABLE {HISTORY} ADD CONSTRAINT {HISTORY}_pkey PRIMARY KEY (id)")
        for table, name, definition in referring:
            cursor.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')


def _set_aside(cursor: Any, table: str) -> None:
    """Rename ``table`` and the indexes that carry names the new table is to take."""
    for name in _indexes(cursor, table):
        if not name.endswith(DEFAULT):  # the checkpoint table's new key, named so already
            cursor.execute(f'ALTER INDEX "{name}" RENAME TO "{name}{DEFAULT}"')
    cursor.execute(f"ALTER TABLE {table} RENAME TO {table}{DEFAULT}")


def _create_parent(cursor: Any, table: str, key: str, including: str) -> None:
    """The partitioned table, with the old one's columns, checks, keys and indexes, by name."""
    old = f"{table}{DEFAULT}"
    cursor.execute(
        f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE"
        f"{including}) PARTITION BY RANGE ({key})"
    )
    cursor.execute(
        "SELECT c.conname, pg_get_constraintdef(c.oid), i.relname FROM pg_constraint c "
        "LEFT JOIN pg_class i ON i.oid = c.conindid WHERE c.conrelid = %s::regclass AND c.contype IN ('p', 'u')",
        [old],
    )
    keyed = set()
    for name, definition, index in cursor.fetchall():
        keyed.add(index)
        name = f"{HISTORY}_pkey" if name == HISTORY_KEY else name.removesuffix(DEFAULT)
        cursor.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND schemaname = current_schema()",
        [old],
    )
    for name, definition in cursor.fetchall():
        if name not in keyed:
            # pg_indexes gives the old name and table, qualified by schema; the new ones in place.
            made = definition.replace(f"INDEX {name} ", f"INDEX {name.removesuffix(DEFAULT)} ", 1)
            cursor.execute(made.replace(f" ON {_schema(cursor)}.{old} ", f" ON {table} ", 1))


def _triggers(cursor: Any) -> list[tuple[str, str, str]]:
    """(table, name, definition) of the triggers of both tables (``durable_run_ended``, which
    announces runs' ends, and any of the project's), a partition's clones of them left out."""
    cursor.execute(
        "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger "
        "WHERE tgrelid IN (%s::regclass, %s::regclass) AND NOT tgisinternal AND tgparentid = 0 ORDER BY 1, 2",
        [RUNS, HISTORY],
    )
    return list(cursor.fetchall())


def _foreign_keys(cursor: Any, where: str) -> list[tuple[str, str, str]]:
    """(table, name, definition) of the foreign keys matching ``where``."""
    cursor.execute(
        f"SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        f"WHERE contype = 'f' AND {where} ORDER BY 1, 2"
    )
    return list(cursor.fetchall())


def _indexes(cursor: Any, table: str) -> list[str]:
    cursor.execute(
        "SELECT indexname FROM pg_indexes WHERE tablename = %s AND schemaname = current_schema()", [table]
    )
    return [name for (name,) in cursor.fetchall()]


def _sequence(cursor: Any, table: str) -> str:
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    return str(cursor.fetchone()[0])


def _schema(cursor: Any) -> str:
    cursor.execute("SELECT current_schema()")
    return str(cursor.fetchone()[0])
