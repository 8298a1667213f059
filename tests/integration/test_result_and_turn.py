"""A step's result written with its run's next turn (PostgreSQL): the body is replayed before any
write, and the result, the settle and the next step's position are one statement, fenced by the
version of the run's row the take read. Whatever moved the run in between, and whatever the
turn would do besides starting the next step, goes the usual way, and nothing runs twice."""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError, connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import durable
from durable import conf
from durable.engine import attempts
from durable.models import CheckpointQuerySet
from durable.models import result_and_turn as rows

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the fence is PostgreSQL's row version"),
]

RAN: list[str] = []


@durable.step
def plain(i):
    RAN.append(f"plain {i}")
    return i


@durable.step
def signals_its_run(run_id, name):
    # What a client does while the step runs: a wake the take did not see.
    durable.signal(run_id, name, "now")
    return "signalled"


@durable.step(local=True)
def local_effect(i):
    RAN.append(f"local {i}")
    return i * 10


@durable.workflow(name="tests.ahead.signal")
def waits_for_a_signal(ctx, _=None):
    first = ctx.step(signals_its_run, ctx.run_id, "go")
    return [first, ctx.wait_for_signal("go"), ctx.step(plain, 2)]


@durable.workflow(name="tests.ahead.unrelated")
def signalled_unawares(ctx, _=None):
    first = ctx.step(signals_its_run, ctx.run_id, "unrelated")
    return [first, ctx.step(plain, 2)]


@durable.workflow(name="tests.ahead.local")
def local_after(ctx, _=None):
    return [ctx.step(plain, 1), ctx.step(local_effect, 2)]


@durable.workflow(name="tests.ahead.swallows")
def swallows_everything(ctx, _=None):
    first = ctx.step(plain, 1)
    try:
        second = ctx.step(local_effect, 2)
    except BaseException:  # noqa: BLE001 - a careless body: the stop must hold anyway
        second = None
    return [first, second]


@durable.workflow(name="tests.ahead.logs")
def logs_between(ctx, _=None):
    first = ctx.step(plain, 1)
    ctx.logger.info("between the steps")
    return [first, ctx.step(plain, 2), ctx.step(plain, 3)]


@durable.workflow(name="tests.ahead.child")
def one_plain_step(ctx, i):
    return ctx.step(plain, i)


@durable.workflow(name="tests.ahead.parent")
def waits_for_a_child(ctx, _=None):
    return ctx.child(one_plain_step, 7) + 1


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


def _settles(sql: list[str]) -> list[str]:
    return [q for q in sql if q.startswith("WITH recorded AS") and "settled AS" in q]


def test_the_next_step_is_written_with_the_result(durable_env):
    run = durable.start(logs_between)
    with CaptureQueriesContext(connection) as captured:
        durable_env.run_until_idle()
    assert durable.result(run.id) == [1, 2, 3]
    # The first and second steps' results went with the next step's position; the third's with
    # the end of the run.
    assert len(_settles([q["sql"] for q in captured.captured_queries])) == 3
    assert RAN == ["plain 1", "plain 2", "plain 3"]


def test_the_last_result_ends_its_run_in_the_same_statement_and_the_end_is_told(durable_env):
    ended = []

    def completed(sender, run_id, status, output, **_):
        ended.append((run_id, status, output))

    durable.signals.run_completed.connect(completed)
    try:
        run = durable.start(one_plain_step, 5)
        durable_env.run_until_idle()
    finally:
        durable.signals.run_completed.disconnect(completed)
    assert durable.result(run.id) == 5
    assert ended == [(run.id, "completed", 5)]
    stored = durable.get_run(run.id)
    assert (stored.locked_by, stored.wake_at, stored.finished_at is not None) == (None, None, True)


def test_a_child_ends_the_usual_way_and_its_parent_hears_of_it(durable_env, monkeypatch):
    write, written = CheckpointQuerySet.complete_and_settle, []
    monkeypatch.setattr(
        CheckpointQuerySet, "complete_and_settle", lambda *a, **k: written.append(a) or write(*a, **k)
    )
    parent = durable.start(waits_for_a_child)
    durable_env.run_until_idle()
    assert durable.result(parent.id) == 8
    assert written == []  # a child's end tells its parent, in the transaction that ends it


def test_a_wake_while_the_step_ran_refuses_the_turn_ahead_and_the_run_goes_on(durable_env, monkeypatch):
    write, written = CheckpointQuerySet.complete_and_settle, []
    monkeypatch.setattr(
        CheckpointQuerySet,
        "complete_and_settle",
        lambda *a, **k: written.append(write(*a, **k)) or written[-1],
    )
    run = durable.start(signalled_unawares)
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["signalled", 2]
    # The signal moved the run after the take: the result was recorded, the settle refused,
    # and the run was woken for a turn that reads it as it stands. The last result ended the run.
    assert written == [(True, False), (True, True)]
    assert RAN == ["plain 2"]


def test_a_signal_taken_by_the_turn_ahead_leaves_the_write_to_the_usual_path(durable_env):
    run = durable.start(waits_for_a_signal)
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["signalled", "now", 2]
    assert RAN == ["plain 2"]


@pytest.mark.parametrize("workflow", [local_after, swallows_everything])
def test_a_local_step_next_is_never_run_ahead(durable_env, workflow):
    run = durable.start(workflow)
    durable_env.run_until_idle()
    assert durable.result(run.id) == [1, 20]
    assert RAN == ["plain 1", "local 2"]  # each ran once: the turn ahead stopped before it


def test_log_lines_of_the_turn_ahead_are_written_once_and_name_the_body(durable_env, caplog):
    with caplog.at_level(logging.INFO, logger="durable.workflow"):
        run = durable.start(logs_between)
        durable_env.run_until_idle()
    (line,) = [r for r in caplog.records if r.getMessage() == "between the steps"]
    assert (line.run_id, line.seq, line.funcName) == (run.id, 0, "logs_between")


def _first_write_ahead_committed_unseen(monkeypatch) -> list[tuple[bool, bool]]:
    """Cut the connection after the first write ahead committed, before its answer came back;
    return what that write did, once it has."""
    write, cut = CheckpointQuerySet.complete_and_settle, []

    def committed_unseen(*args, **kwargs):
        done = write(*args, **kwargs)
        if not cut:
            cut.append(done)
            raise OperationalError("server closed the connection unexpectedly")
        return done

    monkeypatch.setattr(CheckpointQuerySet, "complete_and_settle", committed_unseen)
    return cut


def test_a_commit_never_confirmed_is_repaired(durable_env, monkeypatch):
    """The connection is cut after the statement committed: the try again finds the attempt
    settled, and the next step, written but never sent, is sent again."""
    cut = _first_write_ahead_committed_unseen(monkeypatch)
    run = durable.start(logs_between)
    durable_env.run_until_idle()
    assert cut == [(True, True)]
    assert durable.result(run.id) == [1, 2, 3]
    assert RAN == ["plain 1", "plain 2", "plain 3"]


def test_an_end_never_confirmed_leaves_the_run_ended_and_the_step_run_once(durable_env, monkeypatch):
    """The connection is cut after the statement that ended the run committed: the try again
    finds the attempt settled, and nothing is left to send or to run again."""
    cut = _first_write_ahead_committed_unseen(monkeypatch)
    run = durable.start(one_plain_step, 4)
    durable_env.run_until_idle()
    assert cut == [(True, True)]
    assert durable.result(run.id) == 4
    assert RAN == ["plain 4"] and durable_env.pending() == []


@durable.workflow(name="tests.ahead.fan")
def fan(ctx, _=None):
    return ctx.all([ctx.defer(plain, 1), ctx.defer(plain, 2)])


def test_a_fan_member_is_recorded_the_usual_way_and_reads_no_run(durable_env, monkeypatch):
    taken, take = [], rows.take

    def noted(*args, **kwargs):
        row, read = take(*args, **kwargs)
        taken.append((row.seq, read is not None))
        return row, read

    monkeypatch.setattr(rows, "take", noted)
    run = durable.start(fan)
    with CaptureQueriesContext(connection) as captured:
        durable_env.run_until_idle()
    assert durable.result(run.id) == [1, 2]
    assert taken == [(0, False), (1, False)]
    assert not _settles([q["sql"] for q in captured.captured_queries])


@override_settings(DURABLE={"INLINE_NEXT_TURN": False})
def test_a_worker_that_sends_every_turn_records_the_usual_way(durable_env):
    assert not attempts.reads_run_with_take(conf.get())
    run = durable.start(logs_between)
    with CaptureQueriesContext(connection) as captured:
        durable_env.run_until_idle()
    assert durable.result(run.id) == [1, 2, 3]
    assert not _settles([q["sql"] for q in captured.captured_queries])


@durable.workflow(name="tests.ahead.careless_wait")
def careless_wait(ctx, _=None):
    first = ctx.step(plain, 1)
    try:
        got = ctx.wait_for_signal("go")
    except BaseException:  # noqa: BLE001 - a careless body
        got = "caught"
    return [first, got, ctx.step(plain, 2)]


def test_a_query_that_fails_in_the_turn_ahead_leaves_the_write_to_the_usual_path(durable_env, monkeypatch):
    """Even for a body that catches everything: nothing is written ahead, and the turn that runs
    next reads the signal."""
    from durable.engine import histories

    load, failed = histories.unconsumed_signals, []

    def fails_once(*args):
        if not failed:
            failed.append(True)
            raise OperationalError("server closed the connection unexpectedly")
        return load(*args)

    run = durable.start(careless_wait)
    durable.signal(run.id, "go", "now")
    monkeypatch.setattr(histories, "unconsumed_signals", fails_once)
    durable_env.run_until_idle()
    assert failed
    assert durable.result(run.id) == [1, "now", 2]
