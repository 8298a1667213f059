"""A step's result and its run's next turn written by one statement (PostgreSQL only).

The worker that takes an attempt reads, in the same statement, the run as it then stands (its row,
its row version and its positions). With the step's result in hand it replays the body ahead of
recording; when the turn only starts the next step, the result, the settle and the next position
are one statement, written only if the run's row is still the version read with the take: no
wake, claim or turn came in between, so the replay saw what a turn would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections

from ..statuses import CheckpointStatus
from .base import Status, insertion, instances, updating
from .checkpoints import Checkpoint, _completed, _pending, _positions
from .runs import Run


@dataclass
class Ahead:
    """The run of a taken attempt, as the take read it: its row, the row's version (PostgreSQL's
    ``xmin``: any write to the row changes it), and its positions (dicts of the fields asked)."""

    run: Run
    version: str
    positions: list[dict[str, Any]]


def take(
    db: str,
    run_id: str,
    seq: int,
    attempt: int,
    token: str | None,
    holder: str,
    now: datetime,
    until: datetime,
    fields: tuple[str, ...],
) -> tuple[Checkpoint | None, Ahead | None]:
    """``CheckpointQuerySet.take``, reading the run too when it waits for this position alone:
    suspended, admitted, and no other position of it pending (a pending one may change without
    its run's row, a fan member's result say); not for a fan member or a limited step. The
    positions are those before the take."""
    connection = connections[db]
    ops = connection.ops
    taking, params = Checkpoint.objects.using(db).taking(run_id, seq, attempt, token, holder, now, until)
    runs, positions = ops.quote_name(Run._meta.db_table), ops.quote_name(Checkpoint._meta.db_table)
    run_columns = [f.column for f in Run._meta.concrete_fields]
    read = ", ".join(f"r.{ops.quote_name(c)} AS {ops.quote_name('run__' + c)}" for c in run_columns)
    listed = ", ".join(ops.quote_name(Checkpoint._meta.get_field(name).column) for name in fields)
    sql = (
        f"WITH taken AS ({taking}) SELECT taken.*, r.xmin::text AS durable_version, {read}, "
        f"(SELECT json_agg(json_build_array({listed}) ORDER BY seq) FROM {positions} "
        "WHERE run_id = taken.run_id) AS durable_history "
        f"FROM taken LEFT JOIN {runs} r ON r.id = taken.run_id AND r.status = %s AND r.admitted "
        # A fan member's or a limited step's result is never written ahead (see ``record``).
        "AND taken.fan IS NULL AND taken.flow_key IS NULL "
        f"AND NOT EXISTS (SELECT 1 FROM {positions} o WHERE o.run_id = taken.run_id "
        "AND o.seq <> taken.seq AND o.status = %s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, Status.SUSPENDED, CheckpointStatus.PENDING])
        columns = tuple(column[0] for column in cursor.description)
        rows = cursor.fetchall()
    if not rows:
        return None, None
    (row,) = rows
    split = columns.index("durable_version")
    (taken,) = instances(Checkpoint, db, columns[:split], [row[:split]])
    version = row[split]
    if version is None:
        return taken, None
    named = tuple(c.removeprefix("run__") for c in columns[split + 1 : -1])
    (run,) = instances(Run, db, named, [row[split + 1 : -1]])
    ended = {"status": CheckpointStatus.PENDING}  # as before the take: the replay overwrites it
    return taken, Ahead(run, version, _positions(row[-1], fields, -1, ended))


def complete_and_settle(
    db: str,
    run_id: str,
    seq: int,
    attempt: int,
    output: Any,
    now: datetime,
    version: str,
    settled: dict[str, Any],
    inserting: Checkpoint,
) -> tuple[bool, bool]:
    """``complete`` the attempt and, if it was and the run's row is still ``version`` (suspended),
    settle the run with ``settled`` and insert ``inserting``, in one statement: (whether the
    result was recorded, whether the run was settled with it)."""
    connection = connections[db]
    record, params = updating(Checkpoint, db, _completed(output, now), _pending(run_id, seq, attempt))
    fields = {**settled, "recovery_attempts": 0, "locked_by": None, "locked_until": None, "updated_at": now}
    settle, settle_params = updating(
        Run,
        db,
        fields,
        {"id": run_id, "status": Status.SUSPENDED},
        " AND xmin::text = %s AND EXISTS (SELECT 1 FROM recorded)",
    )
    adding, adding_params = insertion(Checkpoint, db, [inserting], source="FROM settled")
    sql = (
        f"WITH recorded AS ({record} RETURNING 1), settled AS ({settle} RETURNING 1), "
        f"added AS ({adding} RETURNING 1) "
        "SELECT (SELECT COUNT(*) FROM recorded), (SELECT COUNT(*) FROM settled)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *settle_params, version, *adding_params])
        recorded, settled_count = cursor.fetchone()
    return bool(recorded), bool(settled_count)
