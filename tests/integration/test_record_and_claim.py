"""A result recorded, its run woken and its next turn claimed in one statement (PostgreSQL)
reads the run's positions for that turn in the same statement, but only when they are the
positions the turn must see: a wake that landed while the statement waited for the run's row
was not in the table as the statement saw it."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import durable
from durable import clock
from durable.engine import histories, turn
from durable.models import Checkpoint, Claim, Run
from durable.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@durable.step
def first(i):
    return i


@durable.step
def second(i):
    return -i


@durable.workflow(name="tests.record_and_claim")
def two_at_once(ctx, _=None):
    return ctx.all([ctx.defer(first, 1), ctx.defer(second, 2)])


def _started(durable_env):
    run = durable.start(two_at_once)
    durable_env.drop()
    turn.advance(run.id)
    durable_env.drop()  # the two step messages: this test records their results itself
    rows = list(Checkpoint.objects.filter(run_id=run.id).order_by("seq"))
    assert [r.status for r in rows] == ["pending", "pending"]
    return run, rows


def _waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH recorded AS%%'"
        )
        return cursor.fetchone() is not None


def _record(row, output):
    now = clock.now()
    claim = Claim(f"test/{row.seq}", timedelta(seconds=30), None)
    return Checkpoint.objects.complete_and_wake(
        row.run_id,
        row.seq,
        row.attempt,
        output,
        now,
        now + timedelta(seconds=30),
        claim,
        histories.RECORD_FIELDS,
    )


@override_settings(DURABLE={"EAGER_STEPS": False})
def test_the_claim_reads_the_positions_with_the_result(postgres, durable_env):
    run, (a, _) = _started(durable_env)
    done = _record(a, 1)
    assert done.done and done.claimed is not None and done.claimed.locked_by == "test/0"
    positions = {p["seq"]: p for p in done.history}
    # The recorded position as the statement left it, the other as it is.
    assert positions[0]["status"] == "completed" and positions[0]["output"] == 1
    assert positions[0]["finished_at"] is not None and positions[0]["finished_at"].tzinfo is not None
    assert positions[1]["status"] == "pending" and positions[1]["enqueued_at"] is not None
    stored = histories.stored(run.id, "default")
    assert histories.records(done.history).keys() == stored.keys()
    for seq, rec in histories.records(done.history).items():
        for field in histories.RECORD_FIELDS:
            assert getattr(rec, field) == getattr(stored[seq], field), (seq, field)


@override_settings(DURABLE={"EAGER_STEPS": False})
def test_a_wake_that_landed_while_the_claim_waited_makes_the_turn_read_again(postgres, durable_env):
    run, (a, b) = _started(durable_env)
    locked, release, outcome = threading.Event(), threading.Event(), {}

    def the_other_result():
        # Another worker records b's result and wakes the run, holding the run's row meanwhile.
        try:
            with transaction.atomic():
                assert Checkpoint.objects.complete(b.run_id, b.seq, b.attempt, -2, clock.now())
                now = clock.now()
                Run.objects.wake(run.id, now, now + timedelta(seconds=30))
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    other = threading.Thread(target=the_other_result)
    other.start()
    assert locked.wait(10)

    def record_a():
        try:
            outcome["done"] = _record(a, 1)
        finally:
            connections.close_all()

    recorder = threading.Thread(target=record_a)
    recorder.start()
    # It began, saw the table without b's result, and waits for the run's row.
    wait_for(_waiting_for_a_lock, timeout=10, what="the recording statement to wait for the run's row")
    assert recorder.is_alive()
    release.set()
    other.join(10)
    recorder.join(10)
    done = outcome["done"]
    assert done.done and done.claimed is not None
    # The positions it saw lack b's result, which the wake it counted announced: not the turn's.
    assert done.history is None
    connection.close()
    assert turn.advance_claimed(done.claimed, done.claimed.locked_by) == "completed"
    assert durable.result(run.id) == [1, -2]
