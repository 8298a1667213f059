"""A turn that takes an ``async def`` step for its own process reads the attempt back with its
settle (PostgreSQL): the row and the run it hands to the attempt are what reading them after the
commit would give, so the attempt's result is later written ahead against the right version."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection

import durable
from durable import clock, conf, values
from durable.engine import histories
from durable.models import Checkpoint, Run, Status
from durable.models import result_and_turn as rows
from durable.models.runs import settling
from durable.statuses import CheckpointStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="one statement with RETURNING on PostgreSQL"
    ),
]

HOLDER = "tests/held-read-back"
FIELDS = histories.RECORD_FIELDS


@durable.workflow(name="tests.held_read_back")
def two_steps(ctx, order):
    return order


def _claimed(first: str = CheckpointStatus.COMPLETED) -> Run:
    run = durable.start(two_steps, {"total": Decimal("12.30")})
    claimed = Run.objects.claim(run.id, "tests/owner", clock.now(), conf.get().LEASE)
    assert claimed is not None
    Checkpoint.objects.create(
        run_id=run.id,
        seq=0,
        kind="step",
        name="tests.charge",
        status=first,
        input=values.encode({"args": [Decimal("12.30")]}, what="the input"),
        output=values.encode(
            {"charged_at": dt.datetime(2026, 12, 6, 9, 30, tzinfo=dt.UTC), "total": Decimal("12.30")},
            what="the output",
        ),
        started_at=clock.now(),
        finished_at=clock.now() if first == CheckpointStatus.COMPLETED else None,
    )
    return claimed


def _held(run: Run, seq: int = 1) -> Checkpoint:
    now = clock.now()
    return Checkpoint(
        run_id=run.id,
        seq=seq,
        kind="step",
        name="tests.ship",
        status=CheckpointStatus.PENDING,
        input=values.encode({"args": [{"when": dt.date(2026, 12, 7)}]}, what="the input"),
        enqueued_at=now,
        started_at=now,
        held_by=HOLDER,
        held_until=now + conf.get().LEASE,
        token="t0ken",
    )


def _settle(run: Run) -> tuple[dict, dict]:
    return settling(
        run.id, run.locked_by, run.wakes, clock.now(), {"status": Status.SUSPENDED, "wake_at": None}
    )


def _fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_the_attempt_and_its_run_read_back_are_what_a_read_after_the_commit_gives(durable_env):
    run = _claimed()
    held = rows.settle_holding("default", _settle(run), _held(run), FIELDS)
    assert held is not None
    row, read = held
    after_row, after_read = rows.held("default", run.id, 1, 1, HOLDER, FIELDS)
    assert after_row is not None and after_read is not None and read is not None
    assert _fields(row) == _fields(after_row)
    assert read.version == after_read.version
    assert _fields(read.run) == _fields(after_read.run)
    assert read.positions == after_read.positions
    assert [p["seq"] for p in read.positions] == [0, 1]
    assert values.decode(read.positions[0]["output"])["total"] == Decimal("12.30")
    assert Run.objects.get(id=run.id).status == Status.SUSPENDED


def test_a_refused_settle_writes_nothing_and_reads_nothing(durable_env):
    run = _claimed()
    Run.objects.filter(id=run.id).update(wakes=run.wakes + 1)  # a wake since the turn read it
    assert rows.settle_holding("default", _settle(run), _held(run), FIELDS) is None
    assert not Checkpoint.objects.filter(run_id=run.id, seq=1).exists()
    assert Run.objects.get(id=run.id).status == Status.RUNNING


def test_a_run_that_waits_for_more_than_the_attempt_is_not_read(durable_env):
    run = _claimed(first=CheckpointStatus.PENDING)  # a timer, say, still to fire
    held = rows.settle_holding("default", _settle(run), _held(run), FIELDS)
    assert held is not None
    row, read = held
    assert read is None
    assert _fields(row) == _fields(rows.held("default", run.id, 1, 1, HOLDER, FIELDS)[0])
