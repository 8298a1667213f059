"""What every row module shares: the run statuses as choices, row locking, column lengths, plain
guarded UPDATEs."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from django.db import connections, models, transaction

from ..statuses import RunStatus

M = TypeVar("M", bound=models.Model)

#: The run statuses as Django choices, built from the one spelling (its members equal RunStatus's).
Status = models.TextChoices("Status", [(status.name, status.value) for status in RunStatus])

#: The ends a retry may undo.
RETRYABLE = (Status.FAILED, Status.DEAD, Status.CANCELLED)
#: Who holds an attempt kept alive by heartbeat messages: its worker is no process of this fleet.
BEAT_HOLDER = "heartbeat-message"

#: The parameters one statement may carry. PostgreSQL's protocol counts them in 16 bits (at most
#: 65,535) and SQLite allows 32,766 by default: a statement whose parameters grow with the work
#: (a fan's positions, the runs of a tree) is cut into statements of at most this many, well below
#: both, so a fan of any width is written rather than refused.
PARAMS_PER_STATEMENT = 30_000
#: The ids one ``IN (...)`` list names.
IDS_PER_STATEMENT = 10_000


@contextlib.contextmanager
def pipelined(db: str) -> Iterator[None]:
    """Send the statements run in the block without waiting for each answer; all are answered,
    and committed as one transaction, when it ends (psycopg 3's pipeline mode on PostgreSQL, in
    autocommit: one round trip and one commit for all, and an error in one writes none of them).
    Read their cursors after the block. Elsewhere (SQLite, psycopg2, an open transaction) the
    statements run one by one as usual.

    Not under a transaction: there the statements would commit with it, and an error would
    leave it broken behind the caller's back."""
    connection = connections[db]
    connection.cursor().close()  # a health check due runs now, answered, not inside the pipeline
    raw = connection.connection
    if connection.vendor != "postgresql" or connection.in_atomic_block or not hasattr(raw, "pipeline"):
        yield
        return
    with connection.wrap_database_errors, raw.pipeline():
        yield


def chunked(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """``items`` in slices of at most ``size``; one (possibly empty) slice when they fit in one."""
    if len(items) <= size:
        yield items
        return
    for start in range(0, len(items), size):
        yield items[start : start + size]


def referring(qs: models.QuerySet[Any], relation: str) -> Any:
    """The model whose rows refer to ``qs``'s through ``relation`` (its ``related_name``): a run's
    positions or signals, reached without importing their module, which imports the run's."""
    return qs.model._meta.get_field(relation).related_model


def skip_locked(qs: models.QuerySet[Any]) -> models.QuerySet[Any]:
    # SKIP LOCKED only spreads concurrent sweeps on PostgreSQL; guarded UPDATEs keep correctness.
    if qs.db and supports_skip_locked(qs.db):
        return qs.select_for_update(skip_locked=True)
    return qs


def supports_skip_locked(alias: str) -> bool:
    return bool(connections[alias].features.has_select_for_update_skip_locked)


def commit_without_waiting(db: str) -> None:
    """Let the open transaction's commit return before the disk has it (PostgreSQL's
    ``synchronous_commit`` off for this transaction alone). Only for writes a crash may lose
    because whoever made them makes them again: a heartbeat, a sweep's batch. Any later commit
    that waits for the disk (a turn's, say) makes this one durable as well."""
    connection = connections[db]
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def batch_of(qs: models.QuerySet[Any]) -> tuple[str, list[Any]]:
    """``WITH batch AS MATERIALIZED (<the query>)``, to put before a statement that takes the
    rows it names. Materialized: as a plain ``IN (SELECT … LIMIT n)`` PostgreSQL may run the
    subquery again for every row it joins, and the LIMIT then bounds nothing.

    The statement then picks its rows by id alone: the batch's FOR UPDATE is the guard (it locks
    each row and re-checks the query's condition on the row's latest version; SQLite has a single
    writer), and a condition repeated there would let PostgreSQL read the rows through the
    condition's index, every row that meets it, instead of the batch's few by primary key."""
    # Compiled, not run: Django wants FOR UPDATE inside a transaction, and no savepoint (two
    # round trips) inside the caller's.
    with transaction.atomic(using=qs.db, savepoint=False):
        sql, params = qs.query.get_compiler(qs.db).as_sql()
    return f"WITH batch AS MATERIALIZED ({sql})", list(params)


def unflushed(db: str) -> str:
    """``commit_without_waiting`` for one UPDATE in autocommit: the clause between its SET and
    its WHERE that turns ``synchronous_commit`` off for the statement's own transaction (none
    off PostgreSQL). For a claim or a take: a crash that forgets one forgets a lease or a hold
    not taken, judged then as if it never was; every result and position is written by a commit
    that waits, and that commit makes the ones before it durable too. Inside a transaction
    (a limited step's take, with its slot): nothing, the transaction's commit waits as it would."""
    connection = connections[db]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return ""
    return "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unflushed "


@functools.cache
def column_length(model: str, field: str) -> int:
    """The ``max_length`` of a durable model's column: what a string stored there may hold."""
    from django.apps import apps

    length: int = apps.get_model("durable", model)._meta.get_field(field).max_length
    return length


@functools.cache
def all_columns(model: type[models.Model], db: str) -> str:
    """Every column of ``model``, named, for a ``RETURNING``: a prepared statement (see the
    example project's settings) that names them keeps its row type when a migration adds a
    column, where one of ``*`` fails ("cached plan must not change result type") until its
    connection closes."""
    ops = connections[db].ops
    return ", ".join(ops.quote_name(c) for c in column_names(model))  # type: ignore[arg-type]  # a class hashes


@functools.cache
def column_names(model: type[models.Model]) -> tuple[str, ...]:
    """The columns ``all_columns`` names, in its order."""
    return tuple(f.column for f in model._meta.concrete_fields)


def update_where(
    model: type[models.Model],
    db: str,
    fields: dict[str, Any],
    where: dict[str, Any],
    extra: str = "",
    extra_params: tuple[Any, ...] = (),
) -> int:
    """``UPDATE model SET fields WHERE`` each of ``where`` equals its value (and ``extra``, raw
    SQL starting with AND); return the rows changed. The same statement as the ORM's ``update()``
    of a filtered query, without compiling one: on the paths every step takes, compiling cost
    more than the statement."""
    sql, params = updating(model, db, fields, where, extra)
    with connections[db].cursor() as cursor:
        cursor.execute(sql, [*params, *extra_params])
        changed: int = cursor.rowcount
    return changed


def updating(
    model: type[models.Model], db: str, fields: dict[str, Any], where: dict[str, Any], extra: str = ""
) -> tuple[str, list[Any]]:
    """``update_where``'s statement and its parameters (those of ``extra`` not included)."""
    connection = connections[db]
    meta = model._meta
    sql = _update_statement(model, db, tuple(fields), tuple(where), extra)  # type: ignore[arg-type]  # a class hashes
    params = [meta.get_field(name).get_db_prep_save(value, connection) for name, value in fields.items()]
    params += [meta.get_field(name).get_db_prep_value(value, connection) for name, value in where.items()]
    return sql, params


@functools.lru_cache(maxsize=256)
def _update_statement(
    model: type[models.Model], db: str, fields: tuple[str, ...], where: tuple[str, ...], extra: str
) -> str:
    ops = connections[db].ops
    meta = model._meta
    assignments = ", ".join(f"{ops.quote_name(meta.get_field(name).column)} = %s" for name in fields)
    conditions = " AND ".join(f"{ops.quote_name(meta.get_field(name).column)} = %s" for name in where)
    return f"UPDATE {ops.quote_name(meta.db_table)} SET {assignments} WHERE {conditions}{extra}"


def returned(
    model: type[M],
    db: str,
    sql: str,
    params: list[Any] | tuple[Any, ...],
    columns: tuple[str, ...] | None = None,
) -> list[M]:
    """The rows ``sql`` returns (``RETURNING`` every column, or some) as ``model`` instances:
    what ``raw()`` builds, without setting up a raw query each time (on the paths every step
    takes, that cost more than the statement). ``columns``: what ``sql`` returns, when the caller
    knows (``column_names`` for ``all_columns``); else they are read from the row description,
    which builds an object per column of every statement."""
    with connections[db].cursor() as cursor:
        cursor.execute(sql, params)
        if columns is None:
            columns = tuple(column[0] for column in cursor.description)
        rows = cursor.fetchall()
    return instances(model, db, columns, rows)


def instances(model: type[M], db: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[M]:
    """``rows`` read with ``columns`` as ``model`` instances; columns that name none of its
    fields are left out."""
    if not rows:
        return []
    connection = connections[db]
    plan = _loading(model, db, columns, in_model_order=True)  # type: ignore[arg-type]  # a class hashes
    names = [name for name, *_ in plan]
    return [model.from_db(db, names, _converted(row, plan, connection)) for row in rows]


def values_where(
    model: type[models.Model],
    db: str,
    fields: tuple[str, ...],
    where: dict[str, Any],
    order_by: tuple[str, ...],
) -> list[tuple[Any, ...]]:
    """``fields`` of the rows where each of ``where`` equals its value, in ``order_by`` order, as
    tuples: the ORM's ``values_list()`` of a filtered query, without compiling one."""
    connection = connections[db]
    ops = connection.ops
    meta = model._meta
    columns = tuple(meta.get_field(name).column for name in fields)
    matching = [meta.get_field(name) for name in where]
    sql = (
        f"SELECT {', '.join(ops.quote_name(c) for c in columns)} FROM {ops.quote_name(meta.db_table)} "
        f"WHERE {' AND '.join(f'{ops.quote_name(f.column)} = %s' for f in matching)} "
        f"ORDER BY {', '.join(ops.quote_name(meta.get_field(name).column) for name in order_by)}"
    )
    params = [f.get_db_prep_value(where[f.name], connection) for f in matching]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return converted(model, db, columns, rows)


def converted(
    model: type[models.Model], db: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """``rows`` read with ``model``'s ``columns``, each value converted as the ORM would."""
    connection = connections[db]
    plan = _loading(model, db, columns, in_model_order=False)  # type: ignore[arg-type]  # a class hashes
    return [tuple(_converted(row, plan, connection)) for row in rows]


def insertion(
    model: type[models.Model],
    db: str,
    rows: list[models.Model],
    *,
    source: str | None = None,
    keyed: bool = False,
) -> tuple[str, list[Any]]:
    """The ``INSERT`` of ``rows`` and its parameters: primary keys left to the database, or
    with ``keyed`` written as the rows hold them.

    With ``source``, one row is inserted by ``INSERT ... SELECT <its values> <source>``: written
    only when ``source`` (``FROM``/``WHERE`` SQL) yields a row, and in the same statement."""
    if source is not None and len(rows) != 1:
        raise ValueError("an INSERT ... SELECT writes one row")
    connection = connections[db]
    fields = _inserted_fields(model, keyed)  # type: ignore[arg-type]  # a class hashes
    params = [f.get_db_prep_save(f.pre_save(row, True), connection) for row in rows for f in fields]
    return _insert_statement(model, db, len(rows), source, keyed), params  # type: ignore[arg-type]  # a class hashes


@functools.cache
def _inserted_fields(model: type[models.Model], keyed: bool) -> tuple[models.Field[Any, Any], ...]:
    return tuple(f for f in model._meta.concrete_fields if keyed or not f.primary_key)


@functools.lru_cache(maxsize=256)
def _insert_statement(model: type[models.Model], db: str, rows: int, source: str | None, keyed: bool) -> str:
    ops = connections[db].ops
    fields = _inserted_fields(model, keyed)  # type: ignore[arg-type]  # a class hashes
    columns = ", ".join(ops.quote_name(f.column) for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    head = f"INSERT INTO {ops.quote_name(model._meta.db_table)} ({columns}) "
    if source is not None:
        return f"{head}SELECT {placeholders} {source}"
    return head + "VALUES " + ", ".join([f"({placeholders})"] * rows)


@functools.cache
def rows_per_insert(model: type[models.Model]) -> int:
    """The rows of ``model`` one INSERT writes at most: its columns times that stay within
    PARAMS_PER_STATEMENT."""
    columns = sum(1 for f in model._meta.concrete_fields if not f.primary_key)
    return max(1, PARAMS_PER_STATEMENT // columns)


def insert(model: type[models.Model], db: str, rows: list[models.Model]) -> None:
    """Insert ``rows`` without reading back their primary keys (what ``bulk_create`` does, minus
    the compiling): one statement when they fit in ``rows_per_insert``, else one per slice, all in
    one transaction (the caller's, or one of their own), so they are written together or not."""
    if not rows:
        return
    size = rows_per_insert(model)  # type: ignore[arg-type]  # a class hashes
    if len(rows) <= size:
        _insert(model, db, rows)
        return
    with transaction.atomic(using=db, savepoint=False):
        for batch in chunked(rows, size):
            _insert(model, db, list(batch))


def _insert(model: type[models.Model], db: str, rows: list[models.Model]) -> None:
    sql, params = insertion(model, db, rows)
    with connections[db].cursor() as cursor:
        cursor.execute(sql, params)


_Plan = list[tuple[str, int, Any, tuple[Any, ...]]]


def _converted(row: tuple[Any, ...], plan: _Plan, connection: Any) -> list[Any]:
    values = []
    for _, index, column, converters in plan:
        value = row[index]
        for convert in converters:
            value = convert(value, column, connection)
        values.append(value)
    return values


@functools.lru_cache(maxsize=128)
def _loading(model: type[models.Model], db: str, columns: tuple[str, ...], *, in_model_order: bool) -> _Plan:
    """How to read the ``columns`` a statement returned as ``model``'s fields: per field, its
    attribute name, where its value is, and what converts it (as the ORM would); in the model's
    field order (to build instances) or the columns' own."""
    connection = connections[db]
    by_column = {f.column: f for f in model._meta.concrete_fields}
    position = {column: index for index, column in enumerate(columns) if column in by_column}
    order = (
        [f.column for f in model._meta.concrete_fields if f.column in position]
        if in_model_order
        else list(columns)
    )
    plan = []
    for name in order:
        field = by_column[name]
        column = field.get_col(model._meta.db_table)
        converters = (*connection.ops.get_db_converters(column), *field.get_db_converters(connection))
        plan.append((field.attname, position[name], column, tuple(converters)))
    return plan
