"""The reads that let a step's result be written with its run's next turn (PostgreSQL only).

The worker that takes an attempt reads, in the same statement, the run as it then stands (its row,
its row version and its positions). With the step's result in hand it replays the body ahead of
recording; when the turn only starts the next step, the result, the settle and the next position
are one statement (``CheckpointQuerySet.complete_and_settle``; when the turn only ends the run, the
result and the settle), written only if the run's row is still the version read with the take: no
wake, claim or turn came in between, so the replay saw what a turn would have seen.

A run's first turn is written the same way, with no result and no claim (``fresh``,
``settle_first``): the runs not yet taken are read with their rows' versions, and each first turn
that only starts one step is one statement fenced by its version (``engine.first_turns``).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections

from ..statuses import UNFINISHED, CheckpointStatus
from . import read_back
from .base import Status, column_names, insertion, instances, pipelined, updating
from .checkpoints import Checkpoint
from .runs import Run


@dataclass
class RunAsTaken:
    """The run of a taken attempt, as the take read it: its row, the row's version (PostgreSQL's
    ``xmin``: any write to the row changes it), and its positions (dicts of the fields asked)."""

    run: Run
    version: str
    positions: list[dict[str, Any]]


#: An attempt taken for this process, read back by the write that took it: its row, and its run
#: as ``take`` reads one (None when the run does not wait for this attempt alone).
Held = tuple[Checkpoint, RunAsTaken | None]


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
    namespace: str | None = None,
) -> tuple[Checkpoint | None, RunAsTaken | None]:
    """``CheckpointQuerySet.take``, reading the run too when it waits for this position alone:
    suspended, admitted, and no other position of it pending (a pending one may change without
    its run's row, a fan member's result say); not for a fan member or a limited step. The
    positions are those before the take."""
    taken_columns, run_columns, reading = _reading(db, fields)
    ops = connections[db].ops
    taking, params = Checkpoint.objects.using(db).taking(
        run_id,
        seq,
        attempt,
        token,
        holder,
        now,
        until,
        returning=", ".join(map(ops.quote_name, taken_columns)),
        namespace=namespace,
    )
    return _read(db, run_id, reading.format(taking=taking), params, taken_columns, run_columns, fields)


def held(
    db: str, run_id: str, seq: int, attempt: int, holder: str, fields: tuple[str, ...]
) -> tuple[Checkpoint | None, RunAsTaken | None]:
    """The pending attempt ``holder`` holds (a turn took it for that process) and its run, read
    as ``take`` reads them: nothing written."""
    taken_columns, run_columns, reading = _reading(db, fields)
    ops = connections[db].ops
    selecting = (
        f"SELECT {', '.join(map(ops.quote_name, taken_columns))} FROM {ops.quote_name(Checkpoint._meta.db_table)} "
        "WHERE run_id = %s AND seq = %s AND attempt = %s AND status = %s AND held_by = %s AND EXISTS ("
        f"SELECT 1 FROM {ops.quote_name(Run._meta.db_table)} WHERE id = %s AND status IN ({', '.join(['%s'] * len(UNFINISHED))}))"
    )
    params = [run_id, seq, attempt, CheckpointStatus.PENDING, holder, run_id, *UNFINISHED]
    return _read(db, run_id, reading.format(taking=selecting), params, taken_columns, run_columns, fields)


def settle_holding(
    db: str,
    settle: tuple[dict[str, Any], dict[str, Any]],
    inserting: Checkpoint,
    fields: tuple[str, ...],
    fence: tuple[str, list[Any]] = ("", []),
) -> Held | None:
    """A turn's settle (``runs.settling``: its fields, its fence) with the insert of the one
    position it wrote, an attempt it took for this process (``inserting``, held), reading back in
    the same statement what ``held`` reads once the turn commits: the attempt's row and, when the
    run waits for it alone, the run and its positions. None when the settle was refused (nothing
    written). So a turn that starts an ``async def`` step here commits and reads once, not twice.
    ``fence``: SQL appended to the settle's WHERE, and its parameters (a first turn written ahead).

    The statement's reads see the table as it began: the positions read are those before the
    insert, to which the inserted one is added as its RETURNING gives it."""
    sql, params = _holding_statement(db, settle, inserting, fields, fence)
    with connections[db].cursor() as cursor:
        cursor.execute(sql, params)
        return _held_back(db, cursor.fetchall(), fields)


def _holding_statement(
    db: str,
    settle: tuple[dict[str, Any], dict[str, Any]],
    inserting: Checkpoint,
    fields: tuple[str, ...],
    fence: tuple[str, list[Any]],
) -> tuple[str, list[Any]]:
    settling, params = updating(Run, db, *settle, fence[0])
    adding, adding_params = insertion(Checkpoint, db, [inserting], source="FROM settled")
    checks = [Status.SUSPENDED, inserting.run_id, CheckpointStatus.PENDING]
    reads = [*checks, *checks, inserting.run_id]
    return _holding(db, fields, settling, adding), [*params, *fence[1], *adding_params, *reads]


def _held_back(db: str, rows: list[tuple[Any, ...]], fields: tuple[str, ...]) -> Held | None:
    """What ``settle_holding``'s statement read back (None: refused, nothing written)."""
    if not rows:
        return None
    taken_columns, run_columns, _ = _reading(db, fields)
    (row,) = rows
    seq = fields.index("seq")
    found = sorted([*(row[-2] or []), row[-1]], key=lambda values: values[seq])
    return _as_taken(db, row, taken_columns, run_columns, fields, found, {})


def fresh(db: str, run_ids: list[str], namespace: str | None) -> list[tuple[Run, str]]:
    """The runs of ``run_ids`` no turn has taken yet (pending, never started nor claimed,
    admitted; of ``namespace`` when given), each with its row's version: what a first turn
    written ahead replays (``engine.first_turns``), and the version that fences its write."""
    ops = connections[db].ops
    columns = column_names(Run)
    sql = (
        f"SELECT xmin::text, {', '.join(map(ops.quote_name, columns))} FROM {ops.quote_name(Run._meta.db_table)} "
        "WHERE id = ANY(%s) AND status = %s AND started_at IS NULL AND locked_by IS NULL AND admitted"
        + (" AND namespace = %s" if namespace else "")
        + " ORDER BY id"  # durable's ids sort by start (a caller's own need not): turns written so
    )
    with connections[db].cursor() as cursor:
        cursor.execute(sql, [run_ids, Status.PENDING, *([namespace] if namespace else [])])
        rows = cursor.fetchall()
    runs = instances(Run, db, columns, [row[1:] for row in rows])
    return [(run, row[0]) for run, row in zip(runs, rows, strict=True)]


def _first(run_id: str, now: datetime, fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A first turn's settle written ahead: its ``fields``, the run started, no lease to let go;
    the row it writes, still pending (the version fence, ``FIRST_FENCE``, says unchanged)."""
    settled = {
        **fields,
        "started_at": now,
        "recovery_attempts": 0,
        "locked_by": None,
        "locked_until": None,
        "updated_at": now,
    }
    return settled, {"id": run_id, "status": Status.PENDING}


#: The fence of a first turn written ahead: the run's row as ``fresh`` read it.
FIRST_FENCE = " AND xmin::text = %s"


def settle_first(
    db: str, run_id: str, version: str, now: datetime, fields: dict[str, Any], inserting: Checkpoint
) -> bool:
    """Settle a run's first turn, replayed ahead of any claim, with the one position it wrote
    (``inserting``), if the run's row is still ``version``: one statement, no lease taken.
    False (nothing written) when anything wrote the run since ``fresh`` read it."""
    written, _ = settle_firsts(db, [First(run_id, version, now, fields, inserting)], ())[0]
    return written


def settle_first_holding(
    db: str,
    run_id: str,
    version: str,
    now: datetime,
    fields: dict[str, Any],
    inserting: Checkpoint,
    record_fields: tuple[str, ...],
) -> Held | None:
    """``settle_first`` of an attempt taken for this process (``inserting``, held), read back as
    ``settle_holding`` reads it; None when refused."""
    _, held = settle_firsts(db, [First(run_id, version, now, fields, inserting)], record_fields)[0]
    return held


@dataclass
class First:
    """A run's first turn replayed ahead, to write: the run, the version of its row the replay
    read, when, the settle's fields, and the one position the turn wrote (held: an attempt taken
    for this process, read back as ``settle_holding`` reads it)."""

    run_id: str
    version: str
    now: datetime
    fields: dict[str, Any]
    inserting: Checkpoint


def settle_firsts(
    db: str, firsts: list[First], record_fields: tuple[str, ...]
) -> list[tuple[bool, Held | None]]:
    """Write each of ``firsts`` as ``settle_first`` (``settle_first_holding`` for a held position)
    would, each fenced by its own version, all sent before any answer is read and committed
    together (``base.pipelined``): a lot of first turns costs one round trip and one commit,
    not one each. An error writes none of them. For each, in order: whether it was written, and
    the held attempt read back (None when not held or refused)."""
    statements = []
    for first in firsts:
        settle = _first(first.run_id, first.now, first.fields)
        if first.inserting.held_by:
            statements.append(
                _holding_statement(db, settle, first.inserting, record_fields, (FIRST_FENCE, [first.version]))
            )
        else:
            settling, params = updating(Run, db, *settle, FIRST_FENCE)
            adding, adding_params = insertion(Checkpoint, db, [first.inserting], source="FROM settled")
            statements.append(
                (
                    f"WITH settled AS ({settling} RETURNING 1) {adding}",
                    [*params, first.version, *adding_params],
                )
            )
    cursors = []
    try:
        with pipelined(db) if len(statements) > 1 else contextlib.nullcontext():
            for sql, params in statements:
                cursor = connections[db].cursor()
                cursors.append(cursor)
                cursor.execute(sql, params)
        outcomes: list[tuple[bool, Held | None]] = []
        for first, cursor in zip(firsts, cursors, strict=True):
            if first.inserting.held_by:
                held = _held_back(db, cursor.fetchall(), record_fields)
                outcomes.append((held is not None, held))
            else:
                outcomes.append((int(cursor.rowcount) == 1, None))
        return outcomes
    finally:
        for cursor in cursors:
            cursor.close()


@functools.lru_cache(maxsize=64)
def _holding(db: str, fields: tuple[str, ...], settling: str, adding: str) -> str:
    """``settle_holding``'s statement around the settle's UPDATE and the position's INSERT: the
    same few texts each time, built once (quoting its sixty-odd columns each time cost a few
    percent of a turn)."""
    taken_columns, run_columns, _ = _reading(db, fields)
    quote = connections[db].ops.quote_name
    positions = quote(Checkpoint._meta.db_table)
    listed = ", ".join(quote(Checkpoint._meta.get_field(name).column) for name in fields)
    # As ``_reading`` reads a take's run: waiting (the settle suspends it), admitted, the attempt
    # no fan member nor limited, and no other position of the run pending; the run named by a
    # parameter, as there, so that a partitioned history plans one day's partition.
    alone = (
        f"s.{quote('status')} = %s AND s.{quote('admitted')} AND a.{quote('fan')} IS NULL "
        f"AND a.{quote('flow_key')} IS NULL AND NOT EXISTS (SELECT 1 FROM {positions} o "
        f"WHERE o.{quote('run_id')} = %s AND o.{quote('status')} = %s)"
    )
    return (
        f"WITH settled AS ({settling} RETURNING xmin::text AS durable_version, "
        + ", ".join(map(quote, run_columns))
        + f"), added AS ({adding} RETURNING "
        + ", ".join(map(quote, taken_columns))
        + f", json_build_array({listed}) AS durable_position) SELECT "
        + ", ".join(f"a.{quote(c)}" for c in taken_columns)
        + f", CASE WHEN {alone} THEN s.durable_version END, "
        + ", ".join(f"s.{quote(c)}" for c in run_columns)
        + f", CASE WHEN {alone} THEN (SELECT json_agg(json_build_array({listed}) ORDER BY seq) "
        f"FROM {positions} WHERE {quote('run_id')} = %s) END, a.durable_position "
        "FROM settled s CROSS JOIN added a"
    )


def _read(
    db: str,
    run_id: str,
    sql: str,
    params: list[Any],
    taken_columns: tuple[str, ...],
    run_columns: tuple[str, ...],
    fields: tuple[str, ...],
) -> tuple[Checkpoint | None, RunAsTaken | None]:
    with connections[db].cursor() as cursor:
        cursor.execute(sql, [*params, run_id, run_id, Status.SUSPENDED, run_id, CheckpointStatus.PENDING])
        rows = cursor.fetchall()
    if not rows:
        return None, None
    (row,) = rows
    ended = {"status": CheckpointStatus.PENDING}  # as before the take: the replay overwrites it
    return _as_taken(db, row, taken_columns, run_columns, fields, row[-1], ended)


def _as_taken(
    db: str,
    row: tuple[Any, ...],
    taken_columns: tuple[str, ...],
    run_columns: tuple[str, ...],
    fields: tuple[str, ...],
    found: Any,
    ended: dict[str, Any],
) -> Held:
    """A row read as the attempt's columns, the run's version (None: the run was not read) and
    the run's columns, with its positions (``found``) read as JSON."""
    split = len(taken_columns)
    (taken,) = instances(Checkpoint, db, taken_columns, [row[:split]])
    version = row[split]
    if version is None:
        return taken, None
    (run,) = instances(Run, db, run_columns, [row[split + 1 : split + 1 + len(run_columns)]])
    return taken, RunAsTaken(run, version, read_back.positions(Checkpoint, found, fields, -1, ended))


@functools.cache
def _reading(db: str, fields: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """``take``'s columns (the attempt's, the run's) and its statement around ``{taking}``: the
    columns named, so no row description is read (on this path, that cost more than the row)."""
    ops = connections[db].ops
    taken_columns = tuple(f.column for f in Checkpoint._meta.concrete_fields)
    run_columns = tuple(f.column for f in Run._meta.concrete_fields)
    runs, positions = ops.quote_name(Run._meta.db_table), ops.quote_name(Checkpoint._meta.db_table)
    listed = ", ".join(ops.quote_name(Checkpoint._meta.get_field(name).column) for name in fields)
    sql = (
        "WITH taken AS ({taking}) SELECT "
        + ", ".join(f"taken.{ops.quote_name(c)}" for c in taken_columns)
        + ", r.xmin::text, "
        + ", ".join(f"r.{ops.quote_name(c)}" for c in run_columns)
        # The run's id is named as a parameter wherever a table is read, though it is the taken
        # row's own: on a partitioned history (PostgreSQL) the planner then plans the one day's
        # partition, not every day's (4 ms of planning a take, which a custom plan pays each time).
        # Read only when the run was found waiting for this position alone: a fan member's
        # take would otherwise read (and send back) every member of its fan, N times per fan.
        + f", CASE WHEN r.id IS NOT NULL THEN (SELECT json_agg(json_build_array({listed}) ORDER BY seq) "
        f"FROM {positions} WHERE run_id = %s) END "
        f"FROM taken LEFT JOIN {runs} r ON r.id = %s AND r.status = %s AND r.admitted "
        # A fan member's or a limited step's result is never written ahead (see ``record``).
        "AND taken.fan IS NULL AND taken.flow_key IS NULL "
        f"AND NOT EXISTS (SELECT 1 FROM {positions} o WHERE o.run_id = %s "
        "AND o.seq <> taken.seq AND o.status = %s)"
    )
    return taken_columns, run_columns, sql
