"""A durable task that meets a connection the database dropped (a restart, a proxy's idle cut)
still does its work: the step message is the attempt's only prompt for STEP_REDISPATCH_AFTER."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError, connection
from django.test import override_settings

import durable
from durable.engine import steps, wake_batches
from durable.models import Checkpoint
from durable.testing import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RAN: list[int] = []


@durable.step
def count(n: int) -> int:
    RAN.append(n)
    return n


@durable.workflow(name="tests.cut.one_step")
def one_step(ctx: durable.Context, n: int) -> int:
    return ctx.step(count, n)


@durable.workflow(name="tests.cut.step_then_clock")
def step_then_clock(ctx: durable.Context, n: int) -> int:
    # The clock read is a write of the turn after the step: the result is recorded the usual
    # way, with the wake and the claim, not with the run's end.
    done = ctx.step(count, n)
    ctx.now()
    return done


def _drop_this_process_connection() -> None:
    """The database ends this process's session, as a restart does, unseen until the next query."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        # Gone before the step ends, as after a restart: the server's goodbye is on the socket.
        wait_for(
            lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
            10,
            interval=0.01,
            what="the terminated session to end",
        )


def test_a_step_message_that_meets_a_dropped_connection_still_runs_its_attempt(postgres, durable_env):
    RAN.clear()
    run = durable.start(one_step, 7)
    durable_env.run_next()  # the first turn: it sends the step's message
    assert [m.task for m in durable_env.pending()] == ["durable.run_step"]
    _drop_this_process_connection()
    durable_env.run_until_idle()
    assert durable.result(run.id) == 7
    assert RAN == [7]
    assert Checkpoint.objects.get(run_id=run.id).attempt == 1


def test_a_turn_that_meets_a_dropped_connection_sends_the_run_again_once_the_database_answers(
    postgres, durable_env
):
    RAN.clear()
    run = durable.start(one_step, 3)
    _drop_this_process_connection()
    with pytest.raises(Exception, match="terminat|closed|connection"):
        durable_env.run_next()  # the turn's first query meets the dropped session
    # Whatever that turn committed unseen, the run is prompted again instead of waiting for a sweep.
    assert [(m.task, m.args) for m in durable_env.pending()] == [("durable.advance", (run.id,))]
    durable_env.run_until_idle()
    assert durable.result(run.id) == 3 and RAN == [3]


@override_settings(DURABLE={"EAGER_STEPS": False})
def test_a_result_whose_commit_went_unseen_still_runs_the_turn_it_claimed(durable_env):
    """The connection is cut after the database committed the result and the claim of the next
    turn, before the worker heard so: the retry finds the attempt settled, and the turn this
    worker claimed runs now rather than after its lease lapses."""
    RAN.clear()
    run = durable.start(step_then_clock, 5)
    durable_env.run_next()  # the first turn: it sends the step's message
    (message,) = durable_env.drop()
    committed = connection.commit
    claimed = []
    lost = []

    def watch(execute, sql, params, many, context):
        claiming = "locked_by = CASE WHEN" in sql and not any(claimed)
        claimed.append(claiming)
        result = execute(sql, params, many, context)
        if claiming and connection.get_autocommit():
            # One statement recorded, woke and claimed (PostgreSQL): it committed by itself.
            lost.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return result

    def commit_then_lose_the_answer():
        committed()
        if any(claimed) and not lost:  # the transaction that recorded the result and claimed the turn
            lost.append("COMMIT")
            raise OperationalError("server closed the connection unexpectedly")

    connection.commit = commit_then_lose_the_answer
    try:
        with connection.execute_wrapper(watch):
            assert steps.run_step(*message.args) == "stale"  # what the retry found
    finally:
        connection.__dict__.pop("commit", None)
    assert any(claimed) and len(lost) == 1
    assert durable.get_run(run.id).status == "completed"
    assert RAN == [5] and durable_env.pending() == []


def test_a_batch_whose_first_turn_meets_a_dropped_connection_still_turns_the_others(postgres, durable_env):
    RAN.clear()
    ids = [durable.start(one_step, n).id for n in range(3)]
    durable_env.drop()  # their turns come in one batch instead
    _drop_this_process_connection()
    outcomes = wake_batches.advance_batch(ids)
    assert outcomes[0] == "error" and outcomes[1:] == ["suspended", "suspended"]
    # The run whose turn met the dropped session is prompted again once the database answers.
    assert [(m.task, m.args) for m in durable_env.pending()][0] == ("durable.advance", (ids[0],))
    durable_env.run_until_idle()
    assert [durable.result(run_id) for run_id in ids] == [0, 1, 2]
    assert sorted(RAN) == [0, 1, 2]


DROPPED: list[int] = []


@durable.step(name="tests.cut.drops_once")
def drops_once(n: int) -> int:
    if not DROPPED:
        DROPPED.append(n)
        _drop_this_process_connection()  # as a database restart would, right after the step
    return n


@durable.workflow(name="tests.cut.two_in_place")
def two_in_place(ctx: durable.Context, n: int) -> list[int]:
    return [ctx.step(drops_once, n), ctx.step(count, n + 1)]


def test_a_connection_the_database_dropped_under_a_step_run_in_place_is_replaced_for_its_result(
    postgres, durable_env, monkeypatch
):
    """The turn's write after a step run in place would meet a connection the database dropped
    while the step ran (a restart): it is checked first, as at a task's start, and replaced, so
    the step's result is recorded at once instead of the attempt counting as lost and running
    again."""
    RAN.clear()
    DROPPED.clear()
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})  # steps run in place
    run = durable.start(two_in_place, 3)
    durable_env.run_until_idle()
    assert durable.result(run.id) == [3, 4]
    assert DROPPED == [3] and RAN == [4]  # the step that met the dropped session ran once
    assert Checkpoint.objects.get(run_id=run.id, seq=0).attempt == 1
