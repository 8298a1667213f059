"""The history's partitions on PostgreSQL: runs and their positions split by ranges of run id.

Run ids are time-ordered (``durable/ids.py``: the first twelve hexadecimal digits are the start in
milliseconds), so a range of ids is a span of time: each UTC day has a partition of
``durable_run`` and one of ``durable_checkpoint`` with the same bounds, their rows side by side,
and the day's positions refer to the day's runs only (a foreign key from partition to partition).
Retention then drops a day's pair of tables once every run in it has expired (``drop_day``), a
statement in place of ten million deletes and the vacuum they leave behind.

Beside the days, the default partitions (``_pdefault``) hold every id no day takes: the rows
from before the history was partitioned (the old tables became these partitions), ids a caller
chose, ids of a day not made. Retention deletes their runs row by row. Days are made ahead of time
(``AHEAD``) by the retention sweep, so a new run's id finds its day while beat runs.

Elsewhere (SQLite, a database migrated before partitioning is built into it) nothing is
partitioned and every function here says so or does nothing.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import DatabaseError, connections, transaction

log = logging.getLogger("durable.engine")

RUNS, HISTORY = "durable_run", "durable_checkpoint"
#: Days made beyond today: a week without beat before new runs spill into the default partition.
AHEAD = 7
#: How long a drop or a new day waits for the tables' locks before it gives up until the next
#: pass: the statements queued behind it wait as long.
LOCK_TIMEOUT = "2s"
#: After days could not be made, how long the sweep leaves them before it scans again.
RETRY_AFTER = timedelta(hours=1)
_failed_at: datetime | None = None
_BOUNDS = re.compile(r"FOR VALUES FROM \((MINVALUE|'([0-9a-f]*)')\) TO \((MAXVALUE|'([0-9a-f]*)')\)")


@dataclass(frozen=True)
class Day:
    """One day's pair of partitions: runs whose id is at least ``low`` and below ``high``."""

    day: date
    low: str
    high: str

    @property
    def suffix(self) -> str:
        return f"_p{self.day:%Y%m%d}"


def bound(at: datetime | date) -> str:
    """The smallest run id ``durable/ids.py`` makes at ``at`` (a date: its start, UTC), cut to its
    twelve digits of milliseconds: every id made at ``at`` or later sorts at or after it."""
    if not isinstance(at, datetime):
        at = datetime(at.year, at.month, at.day, tzinfo=UTC)
    return f"{int(at.timestamp() * 1000):012x}"


def day_of(day: date) -> Day:
    return Day(day, bound(day), bound(day + timedelta(days=1)))


def is_partitioned(db: str) -> bool:
    connection = connections[db]
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_partitioned_table WHERE partrelid = to_regclass(%s))", [RUNS]
        )
        return bool(cursor.fetchone()[0])


def days(db: str) -> list[Day]:
    """The day partitions of the run table, oldest first (the default one left out)."""
    found = []
    for name, low, high in _partitions(db):
        if name.startswith(f"{RUNS}_p") and name[len(RUNS) + 2 :].isdigit() and len(name) == len(RUNS) + 10:
            found.append(Day(datetime.strptime(name[-8:], "%Y%m%d").date(), low or "", high or ""))
    return sorted(found, key=lambda d: d.low)


def _partitions(db: str) -> list[tuple[str, str | None, str | None]]:
    """Each partition of the run table: its name and bounds (None: unbounded, or the default)."""
    with connections[db].cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [RUNS],
        )
        found = []
        for name, spec in cursor.fetchall():
            match = _BOUNDS.search(spec)
            found.append((name, match and match.group(2), match and match.group(4)))
        return found


def ensure_days(db: str, first: date, last: date) -> list[date]:
    """Make the partitions of the days from ``first`` to ``last`` that have none yet; return the
    days made.

    PostgreSQL makes sure no row of the default partition belongs to a new partition: by a scan
    of it under an exclusive lock, unless a validated constraint of the default partition already
    says so. So the missing days are carved out of the default partitions first: a constraint
    excluding their span, validated while the tables keep taking writes (one scan for all the
    days), then the days, then the constraint dropped. A span the default partition holds rows
    of (ids a caller chose, say) is left to it, with a warning."""
    # Each step commits on its own (the scan must not hold the others' locks); in a transaction
    # holding deferred checks, PostgreSQL refuses to alter the tables at all.
    if connections[db].in_atomic_block or not is_partitioned(db):
        return []
    made = {d.day for d in days(db)}
    missing = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    missing = [day for day in missing if day not in made]
    if not missing:
        return []
    low, high = bound(missing[0]), bound(missing[-1] + timedelta(days=1))
    carve = f"{RUNS}_carve"
    with connections[db].cursor() as cursor:
        try:
            for table in (RUNS, HISTORY):
                key = "id" if table == RUNS else "run_id"
                with transaction.atomic(using=db):
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    cursor.execute(f"ALTER TABLE {table}_pdefault DROP CONSTRAINT IF EXISTS {carve}")
                    cursor.execute(
                        f"ALTER TABLE {table}_pdefault ADD CONSTRAINT {carve} "
                        f"CHECK (NOT ({key} >= '{low}' AND {key} < '{high}')) NOT VALID"
                    )
                # Its own transaction: the scan holds no lock that stops writes.
                cursor.execute(f"ALTER TABLE {table}_pdefault VALIDATE CONSTRAINT {carve}")
            for day in missing:
                with transaction.atomic(using=db):
                    _create(db, day_of(day))
        except DatabaseError as exc:
            log.warning(
                "durable: could not make the history's partitions from %s to %s: %s",
                missing[0],
                missing[-1],
                exc,
            )
            return [d.day for d in days(db) if d.day in missing]
        finally:
            for table in (RUNS, HISTORY):
                with transaction.atomic(using=db):
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    cursor.execute(f"ALTER TABLE {table}_pdefault DROP CONSTRAINT IF EXISTS {carve}")
    return missing


def ensure_ahead(db: str, now: datetime, *, today: bool = False) -> list[date]:
    """Keep the days from tomorrow (UTC) to ``AHEAD`` days ahead made: when fewer than ``AHEAD``
    lie ahead, the next ``2 * AHEAD`` are made at once (one scan of the default partitions per
    ``AHEAD`` days). Today is made only when asked (an empty history): its runs are being
    written, and while the days are carved the default partition refuses their ids."""
    global _failed_at
    if connections[db].in_atomic_block or not is_partitioned(db):
        return []
    first = now.astimezone(UTC).date() + timedelta(days=0 if today else 1)
    made = {d.day for d in days(db)}
    if all(first + timedelta(days=n) in made for n in range(AHEAD)):
        return []
    if _failed_at is not None and now - _failed_at < RETRY_AFTER:
        return []
    wanted = {first + timedelta(days=n) for n in range(2 * AHEAD)}
    done = ensure_days(db, first, max(wanted))
    _failed_at = None if wanted <= made | set(done) else now
    return done


def _create(db: str, day: Day) -> None:
    with connections[db].cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        bounds = f"FOR VALUES FROM ('{day.low}') TO ('{day.high}')"
        cursor.execute(f"CREATE TABLE {RUNS}{day.suffix} PARTITION OF {RUNS} {bounds}")
        cursor.execute(f"CREATE TABLE {HISTORY}{day.suffix} PARTITION OF {HISTORY} {bounds}")
        # The positions' partition refers to its runs' partition, deferred like Django's keys (a
        # run and its first positions go in one transaction in any order).
        cursor.execute(
            f"ALTER TABLE {HISTORY}{day.suffix} ADD CONSTRAINT {HISTORY}{day.suffix}_run_fk FOREIGN KEY (run_id) "
            f"REFERENCES {RUNS}{day.suffix} (id) DEFERRABLE INITIALLY DEFERRED"
        )


def drop_day(db: str, day: Day) -> None:
    """Drop the day's pair of tables, positions first (nothing refers to them), then the runs'
    (detached first: PostgreSQL checks there that no row refers to one of its runs). Call inside
    the transaction that checked every run of the day may go and removed what refers to them
    (``RunTrees.delete_day``)."""
    with connections[db].cursor() as cursor:
        cursor.execute(f"DROP TABLE {HISTORY}{day.suffix}")
        cursor.execute(f"ALTER TABLE {RUNS} DETACH PARTITION {RUNS}{day.suffix}")
        cursor.execute(f"DROP TABLE {RUNS}{day.suffix}")


def lock_day(db: str, day: Day) -> None:
    """Hold off every write to the day's runs and positions until the transaction ends (a retry
    reopening one of its runs waits, then finds it gone), giving up after LOCK_TIMEOUT."""
    with connections[db].cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"LOCK TABLE {RUNS}{day.suffix}, {HISTORY}{day.suffix} IN SHARE MODE")
