"""What every row module shares: the run statuses as choices, row locking, column lengths, plain
guarded UPDATEs."""

from __future__ import annotations

import functools
from typing import Any

from django.db import connections, models

from ..statuses import RunStatus

#: The run statuses as Django choices, built from the one spelling (its members equal RunStatus's).
Status = models.TextChoices("Status", [(status.name, status.value) for status in RunStatus])

#: The ends a retry may undo.
RETRYABLE = (Status.FAILED, Status.DEAD, Status.CANCELLED)
#: Who holds an attempt kept alive by heartbeat messages: its worker is no process of this fleet.
BEAT_HOLDER = "heartbeat-message"


def skip_locked(qs: models.QuerySet[Any]) -> models.QuerySet[Any]:
    # SKIP LOCKED only spreads concurrent sweeps on PostgreSQL; guarded UPDATEs keep correctness.
    if qs.db and supports_skip_locked(qs.db):
        return qs.select_for_update(skip_locked=True)
    return qs


def supports_skip_locked(alias: str) -> bool:
    return bool(connections[alias].features.has_select_for_update_skip_locked)


@functools.cache
def column_length(model: str, field: str) -> int:
    """The ``max_length`` of a durable model's column: what a string stored there may hold."""
    from django.apps import apps

    length: int = apps.get_model("durable", model)._meta.get_field(field).max_length
    return length


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
    connection = connections[db]
    ops = connection.ops
    meta = model._meta
    setting = [meta.get_field(name) for name in fields]
    matching = [meta.get_field(name) for name in where]
    assignments = ", ".join(f"{ops.quote_name(f.column)} = %s" for f in setting)
    conditions = " AND ".join(f"{ops.quote_name(f.column)} = %s" for f in matching)
    params = [f.get_db_prep_save(fields[f.name], connection) for f in setting]
    params += [f.get_db_prep_value(where[f.name], connection) for f in matching]
    sql = f"UPDATE {ops.quote_name(meta.db_table)} SET {assignments} WHERE {conditions}{extra}"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *extra_params])
        return cursor.rowcount
