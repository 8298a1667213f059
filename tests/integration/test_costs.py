"""The database cost of the hot paths, pinned so it cannot silently regress.

Counted on real commits (transactional_db), so savepoints of the test's own transaction do not
blur the numbers. Transaction control (BEGIN, COMMIT) is not counted.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import durable
from durable.engine import steps, turn, wake_batches

pytestmark = pytest.mark.django_db(transaction=True)

#: PostgreSQL writes a result with its wake (and claim), and a turn's one new position with its
#: settle, in one statement each (data-modifying WITH); other databases in a transaction.
FOLDED = connection.vendor == "postgresql"


@durable.step(local=True)
def local_noop(i):
    return i


@durable.step
def remote_noop(i):
    return i


@durable.step(concurrency=5)
def limited_noop(i):
    return i


@durable.workflow(name="tests.cost_limited")
def limited_flow(ctx, n):
    return [ctx.step(limited_noop, i) for i in range(n)]


@durable.workflow(name="tests.cost_local")
def local_flow(ctx, n):
    return [ctx.step(local_noop, i) for i in range(n)]


@durable.workflow(name="tests.cost_remote")
def remote_flow(ctx, n):
    return [ctx.step(remote_noop, i) for i in range(n)]


def statements(run) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        run()
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]


def commits(run) -> int:
    """Transactions that wrote: each write outside a transaction, and each commit of one."""
    count = 0

    def counted(execute, sql, params, many, context):
        nonlocal count
        if connection.get_autocommit() and not sql.lstrip().upper().startswith(("SELECT", "BEGIN", "COMMIT")):
            count += 1
        return execute(sql, params, many, context)

    commit = connection.commit

    def counted_commit():
        nonlocal count
        count += 1
        commit()

    connection.commit = counted_commit
    try:
        with connection.execute_wrapper(counted):
            run()
    finally:
        del connection.commit
    return count


def test_a_turn_that_dispatches_a_step_costs_at_most_four_statements(durable_env):
    run = durable.start(remote_flow, 1)
    durable_env.drop()
    sql = statements(lambda: turn.advance(run.id))
    # claim (UPDATE ... RETURNING), insert the step, settle the run; the run's first turn knows
    # from its claim that there is no history to load.
    assert len(sql) == (2 if FOLDED else 3), sql
    durable_env.run_until_idle()
    again = durable.start(remote_flow, 2)
    durable_env.run_next()  # the first turn
    (step,) = durable_env.drop()
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, set()  # send the next turn, do not run it
    try:
        steps.run_step(*step.args)
    finally:
        transport.served_queues = served
    (wake,) = durable_env.drop()
    assert wake.task == "durable.advance"
    sql = statements(lambda: turn.advance(again.id))
    # claim, load the history, insert the next step, settle.
    assert len(sql) == (3 if FOLDED else 4), sql


@pytest.mark.skipif(not FOLDED, reason="a first turn is written ahead on PostgreSQL only")
def test_a_first_turn_that_only_sends_a_step_costs_a_read_and_one_commit(durable_env):
    run = durable.start(remote_flow, 1)
    durable_env.drop()
    sql = statements(lambda: wake_batches.advance_one(run.id))
    # the run read with its row's version, then the settle and the step's INSERT, fenced by it
    assert len(sql) == 2, sql
    assert sql[0].lstrip().upper().startswith("SELECT"), sql
    again = durable.start(remote_flow, 2)
    durable_env.drop()
    assert commits(lambda: wake_batches.advance_one(again.id)) == 1


def test_a_local_step_costs_one_insert(durable_env):
    one, ten = durable.start(local_flow, 1), durable.start(local_flow, 10)
    durable_env.drop()
    cost_one = statements(lambda: turn.advance(one.id))
    cost_ten = statements(lambda: turn.advance(ten.id))
    assert len(cost_one) == 3, cost_one  # claim, the step's INSERT, settle (a first turn reads no history)
    assert len(cost_ten) - len(cost_one) == 9
    assert durable.result(ten.id) == list(range(10))


def test_a_dispatched_step_costs_at_most_three_statements_before_its_turn(durable_env):
    run = durable.start(remote_flow, 2)
    durable_env.drop()
    turn.advance(run.id)
    (message,) = durable_env.drop()
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, set()  # send the next turn, do not run it
    try:
        sql = statements(lambda: steps.run_step(*message.args))
    finally:
        transport.served_queues = served
    # take the attempt (mark it started, read it), record the result, wake the run.
    assert len(sql) == (2 if FOLDED else 3), sql


def test_a_dispatched_step_run_in_place_costs_an_insert_and_an_update(durable_env):
    one, ten = durable.start(remote_flow, 1), durable.start(remote_flow, 10)
    durable_env.drop()
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, {"durable"}  # a worker of the steps' queue
    try:
        cost_one = statements(lambda: turn.advance(one.id))
        cost_ten = statements(lambda: turn.advance(ten.id))
    finally:
        transport.served_queues = served
    # claim, the step's fenced INSERT as started (so a death is known as the attempt's), its
    # result's UPDATE with the settle (one statement on PostgreSQL). Each further step: the
    # result of the one before and its own start, one statement on PostgreSQL.
    assert len(cost_one) == (3 if FOLDED else 4), cost_one
    assert len(cost_ten) - len(cost_one) == (9 if FOLDED else 18), cost_ten
    assert durable.result(ten.id) == list(range(10))
    assert durable_env.pending() == []


def test_a_limited_step_run_in_place_keeps_the_slot_the_step_before_it_freed(durable_env):
    """A step under a ``concurrency`` limit never reached, in sequence: the first takes its slot
    under its gate's lock; each further one is written with the result before it, whose slot it
    takes over in the same statement (nobody waits for it), no gate locked."""
    first = durable.start(limited_flow, 1)
    one, three = durable.start(limited_flow, 1), durable.start(limited_flow, 3)
    durable_env.drop()
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, {"durable"}
    try:
        turn.advance(first.id)  # the gate's row is made once, by the key's first start
        cost_one = statements(lambda: turn.advance(one.id))
        cost_three = statements(lambda: turn.advance(three.id))
    finally:
        transport.served_queues = served
    # Each further step: the result and the start, the slot with them (one statement on
    # PostgreSQL, two elsewhere).
    assert len(cost_three) - len(cost_one) == (2 if FOLDED else 4), cost_three
    assert _gate_reads(cost_three) == _gate_reads(cost_one), cost_three  # the first take, the last hand-off
    assert durable.result(three.id) == [0, 1, 2]


def _gate_reads(sqls: list[str]) -> int:
    return sum(sql.startswith("SELECT") and "durable_flowgate" in sql for sql in sqls)


def test_a_result_run_in_place_commits_with_the_next_write(durable_env):
    one, ten = durable.start(remote_flow, 1), durable.start(remote_flow, 10)
    durable_env.drop()
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, {"durable"}
    try:
        commits_one = commits(lambda: turn.advance(one.id))
        commits_ten = commits(lambda: turn.advance(ten.id))
    finally:
        transport.served_queues = served
    # The claim; each step's start, with the result of the step before; the last result with
    # the settle.
    assert commits_one == 3
    assert commits_ten - commits_one == 9
    assert durable.result(ten.id) == list(range(10))


@override_settings(DURABLE={"EAGER_STEPS": False})  # every step through the broker
def test_a_dispatched_step_and_its_next_turn_commit_twice_or_three_times(durable_env):
    """The broker path's cost per step, on a worker of the run's queue. On PostgreSQL: take the
    attempt, reading the run; record the result with the next turn, which only starts the next
    step or ends the run (replayed before the write, fenced by the run row's version). Elsewhere:
    take; record, wake and claim; the turn's settle."""
    run = durable.start(remote_flow, 2)
    durable_env.drop()
    turn.advance(run.id)
    (message,) = durable_env.drop()
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, {"durable"}  # a worker of the run's queue
    try:
        sql = statements(lambda: steps.run_step(*message.args))
        (second,) = durable_env.drop()
        written = commits(lambda: steps.run_step(*second.args))
    finally:
        transport.served_queues = served
    # Elsewhere: take; record the result; wake and claim; history; the next step's INSERT; settle.
    assert len(sql) == (2 if FOLDED else 6), sql
    assert sum("locked_by = CASE WHEN" in q for q in sql) == (0 if FOLDED else 1), sql
    # The last step: take; on PostgreSQL the result with the settle that ends the run, elsewhere
    # record, wake and claim, then the settle.
    assert written == (2 if FOLDED else 3)
    assert durable.result(run.id) == [0, 1]


def test_waiting_for_a_finished_runs_result_reads_it_once(durable_env):
    # Its status, output and what shapes the output (the workflow's version): one statement,
    # however often a caller looks (three before: the workflow and version were loaded apart).
    run = durable.start(local_flow, 2)
    durable_env.run_until_idle()
    read = statements(lambda: durable.result(run.id))
    assert len(read) == 1, read
