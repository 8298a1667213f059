"""A sweep's wakes leave in a few ``durable.advance_batch`` messages, not one message per run; the
worker that takes one runs the turn of each of its runs, and one turn that raises costs only its
own run. A batch message durable did not send is refused whole."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

import pytest
from django.db import OperationalError, transaction
from django.test import override_settings

import durable
from durable import dispatch, tasks
from durable.engine import sweeps, turn, wake_batches
from durable.models import Run

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.wake_batches.nap")
def nap(ctx, n):
    ctx.sleep("1m")
    return n


@durable.workflow(name="tests.wake_batches.nap_elsewhere", queue="elsewhere")
def nap_elsewhere(ctx, n):
    ctx.sleep("1m")
    return n


def _napping(env, flow, count: int) -> list[str]:
    ids = [durable.start(flow, n).id for n in range(count)]
    env.run_until_idle()
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {"suspended"}
    return ids


def _due(env) -> None:
    """Move the clock past the naps without running the sweeps: the test runs them."""
    env._freezer.tick(timedelta(minutes=1, seconds=1))


@pytest.mark.parametrize(
    ("runs", "sizes"),
    [
        (0, []),
        (1, [1]),
        (16, [1] * 16),
        (17, [2] + [1] * 15),
        (40, [3] * 8 + [2] * 8),
        (800, [50] * 16),
        (801, [48] * 2 + [47] * 15),
        (10_000, [50] * 200),
    ],
)
def test_wakes_are_shared_over_at_least_wake_spread_messages_of_at_most_wake_batch(runs, sizes):
    ids = [f"run-{i}" for i in range(runs)]
    shares = dispatch.shares(ids)
    assert [len(share) for share in shares] == sizes
    assert [run_id for share in shares for run_id in share] == ids  # in order, none lost


def test_a_sweep_of_many_runs_sends_batches_and_every_run_completes(durable_env):
    ids = _napping(durable_env, nap, 120)
    _due(durable_env)
    assert sweeps.sweep_timers() == 120
    sent = durable_env.pending()
    assert [m.task for m in sent] == [dispatch.ADVANCE_BATCH] * dispatch.WAKE_SPREAD
    assert sorted(run_id for m in sent for run_id in dispatch.woken(m)) == sorted(ids)
    assert durable_env.run_until_idle() == dispatch.WAKE_SPREAD  # the turns send nothing more
    assert [durable.result(run_id) for run_id in ids] == list(range(120))


def test_a_handful_of_wakes_still_leaves_one_message_per_run(durable_env):
    ids = _napping(durable_env, nap, 3)
    _due(durable_env)
    sweeps.sweep_timers()
    sent = sorted((m.task, m.args) for m in durable_env.pending())
    assert sent == sorted((dispatch.ADVANCE, (run_id,)) for run_id in ids)


def test_each_batch_goes_to_the_queue_its_runs_turn_on(durable_env):
    here = _napping(durable_env, nap, 20)
    there = _napping(durable_env, nap_elsewhere, 20)
    _due(durable_env)
    sweeps.sweep_timers()
    by_queue: dict[str, list[str]] = {}
    for message in durable_env.pending():
        by_queue.setdefault(message.queue, []).extend(dispatch.woken(message))
    assert {queue: sorted(woken) for queue, woken in by_queue.items()} == {
        "durable": sorted(here),
        "elsewhere": sorted(there),
    }


def test_a_turn_that_raises_does_not_stop_the_rest_of_its_batch(durable_env, monkeypatch, caplog):
    ids = _napping(durable_env, nap, 40)
    _due(durable_env)
    sweeps.sweep_timers()
    batch = next(m for m in durable_env.pending() if m.task == dispatch.ADVANCE_BATCH)
    victim = dispatch.woken(batch)[1]  # neither first nor last of its batch
    replay = turn._replay

    def a_bug_in_one_turn(run, *args, **kwargs):
        if run.id == victim:
            raise RuntimeError("a bug that only this run's turn meets")
        return replay(run, *args, **kwargs)

    monkeypatch.setattr(turn, "_replay", a_bug_in_one_turn)
    with caplog.at_level(logging.ERROR, logger="durable.engine"):
        durable_env.run_until_idle()
    assert f"the turn of run {victim} raised; the rest of its batch goes on" in caplog.text
    done = dict(Run.objects.filter(id__in=ids).values_list("id", "status"))
    assert {run_id for run_id, status in done.items() if status != "completed"} == {victim}
    # The run keeps a timer a bounded time ahead: the timer sweep's safety net.
    row = Run.objects.get(id=victim)
    assert row.wake_at is not None and row.wake_at <= durable_env.now() + timedelta(minutes=5)
    monkeypatch.undo()
    durable_env.advance_time("31s")  # its lease expires; the orphan sweep gives it back
    assert durable.result(victim) == ids.index(victim)


def test_a_run_whose_batch_message_is_lost_is_woken_again_by_the_timer_sweep(durable_env):
    with override_settings(DURABLE={"RECONCILE_INTERVAL": "10s"}):
        ids = _napping(durable_env, nap, 32)  # two runs a message
        _due(durable_env)
        sweeps.sweep_timers()
        # The broker lost them, and the countdowns the naps' turns sent (a 10 s safety net is near).
        lost = {m.task for m in durable_env.drop()}
        assert dispatch.ADVANCE_BATCH in lost and lost <= {dispatch.ADVANCE_BATCH, dispatch.ADVANCE}
        durable_env.advance_time("11s")
    assert [durable.result(run_id) for run_id in ids] == list(range(32))


@pytest.mark.parametrize(
    "run_ids",
    [
        "run-1",
        None,
        {"run-1": True},
        [],
        [1, 2],
        ["run-1", None],
        ["run-1", ""],
        ["run-1", "x" * 300],
        ["run-1", "nul\x00"],
        ["run-1"] * (wake_batches.MAX_RUN_IDS + 1),
    ],
    ids=[
        "a string",
        "none",
        "a dict",
        "empty",
        "numbers",
        "a None",
        "an empty id",
        "too long an id",
        "a NUL",
        "too many",
    ],
)
def test_a_forged_batch_message_is_refused_and_changes_nothing(durable_env, caplog, run_ids):
    (run_id,) = _napping(durable_env, nap, 1)
    _due(durable_env)  # due: a turn now would wake it and complete it
    if isinstance(run_ids, list):
        run_ids = [run_id if x == "run-1" else x for x in run_ids]
    before = Run.objects.values().get(id=run_id)
    with caplog.at_level(logging.WARNING, logger="durable.engine"):
        # The Celery task itself, run in this process as a worker would run it.
        assert tasks.advance_batch.apply(args=(run_ids,)).get() == []
    assert "refused a durable.advance_batch message: run_ids" in caplog.text
    assert Run.objects.values().get(id=run_id) == before
    assert durable_env.pending() == []


def test_a_finished_run_in_a_batch_is_passed_over(durable_env):
    (done,) = _napping(durable_env, nap, 1)
    durable_env.advance_time("61s")
    assert durable.result(done) == 0
    ids = _napping(durable_env, nap, 2)
    _due(durable_env)
    assert wake_batches.advance_batch([done, *ids]) == ["busy", "completed", "completed"]


def test_a_batch_under_a_celery_time_limit_hands_over_the_turns_it_has_no_time_for(durable_env, monkeypatch):
    ids = _napping(durable_env, nap, 3)
    _due(durable_env)
    # The project limits every task to less than a LEASE (30 s): time for one turn, not three.
    monkeypatch.setitem(tasks.advance_batch.app.conf, "task_time_limit", 29)
    assert tasks.advance_batch.apply(args=(ids,)).get() == ["completed"]
    sent = durable_env.pending()
    assert sorted(run_id for m in sent for run_id in dispatch.woken(m)) == sorted(ids[1:])
    monkeypatch.undo()
    durable_env.run_until_idle()
    assert [durable.result(run_id) for run_id in ids] == [0, 1, 2]


@pytest.mark.django_db(transaction=True)  # the repair after a database error reconnects
def test_a_batch_stops_when_the_database_fails_two_turns_in_a_row(durable_env, monkeypatch, caplog):
    ids = _napping(durable_env, nap, 5)
    _due(durable_env)

    def the_database_is_gone(run_id, settings):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(turn, "_advance", the_database_is_gone)
    with caplog.at_level(logging.WARNING, logger="durable.engine"):
        assert wake_batches.advance_batch(ids) == ["error", "error"]
    assert "3 run(s) of the batch left to the timer sweep" in caplog.text
    monkeypatch.undo()
    durable_env.advance_time("5m")  # each swept run's safety-net wake
    assert [durable.result(run_id) for run_id in ids] == list(range(5))


@pytest.mark.django_db(transaction=True)
def test_runs_started_in_one_transaction_leave_after_it_in_shared_messages(durable_env):
    """A loop of starts in ``atomic()`` (a view under ATOMIC_REQUESTS, say): their first turns
    leave after the commit as a sweep's wakes do, in a few messages, not one per run."""
    with transaction.atomic():
        ids = [durable.start(nap, n).id for n in range(40)]
        assert durable_env.pending() == []
    sent = durable_env.pending()
    assert [len(dispatch.woken(m)) for m in sent] == [3] * 8 + [2] * 8
    assert [run_id for m in sent for run_id in dispatch.woken(m)] == ids
    durable_env.run_until_idle()
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {"suspended"}


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_savepoint_takes_its_runs_wakes_with_it(durable_env):
    with transaction.atomic():
        kept = durable.start(nap, 1).id
        with contextlib.suppress(RuntimeError), transaction.atomic():
            durable.start(nap, 2)
            raise RuntimeError("rolled back")
        also = durable.start(nap, 3).id
    assert [run_id for m in durable_env.pending() for run_id in dispatch.woken(m)] == [kept, also]
    assert Run.objects.count() == 2
