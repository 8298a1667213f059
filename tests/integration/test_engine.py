"""The engine's invariants under injected faults: wakes, fencing, recovery, lost and duplicate messages."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import durable
from durable import clock, dispatch
from durable.engine import steps, sweeps, turn
from durable.errors import _ControlFlow
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

RAN: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    RAN.clear()


@durable.step
def record(name):
    RAN.append(name)
    return name


@durable.step(local=True)
def poke_self(run_id):
    # Runs inside the turn: a wake that lands while the turn is out.
    if not RAN:
        RAN.append("poked")
        durable.signal(run_id, "poke", "hello")
    return True


@durable.step(local=True)
def steal_lease(run_id):
    Run.objects.filter(id=run_id).update(locked_by="someone-else")
    return True


@durable.workflow(name="tests.engine_simple")
def simple_flow(ctx, _):
    return [ctx.step(record, "a"), ctx.step(record, "b")]


@durable.workflow(name="tests.engine_self_wake")
def self_wake_flow(ctx, _):
    ctx.step(poke_self, ctx.run_id)
    return ctx.wait_for_signal("poke")


@durable.workflow(name="tests.engine_zombie")
def zombie_flow(ctx, _):
    ctx.step(steal_lease, ctx.run_id)
    ctx.step(poke_self, ctx.run_id)
    return "zombie finished"


def test_wake_during_a_turn_is_not_lost(durable_env):
    run = durable.start(self_wake_flow)
    durable_env.run_next()  # one advance: the turn sees the stale wake counter and runs again
    assert durable.get_run(run.id).status == "completed"
    assert durable.result(run.id) == "hello"


def test_turn_whose_lease_was_taken_over_writes_nothing(durable_env):
    run = durable.start(zombie_flow)
    assert turn.advance(run.id) == "lost"
    record_ = durable.get_run(run.id)
    assert record_.status == "running" and record_.locked_by == "someone-else"
    # The first local step ran, but the zombie could not record it, nor anything after it.
    assert not Checkpoint.objects.filter(run_id=run.id).exists()
    assert RAN == []


def test_a_held_lease_refuses_a_second_turn(durable_env):
    run = durable.start(simple_flow)
    now = durable_env.now()
    assert Run.objects.claim(run.id, "worker-a/1", now, timedelta(seconds=30))
    assert turn.advance(run.id) == "busy"


def test_orphaned_turn_is_recovered_and_counted(durable_env):
    run = durable.start(simple_flow)
    durable_env.drop()
    Run.objects.claim(run.id, "dead-worker/1", durable_env.now(), timedelta(seconds=30))
    durable_env.advance_time("20s")
    assert durable.get_run(run.id).status == "running"  # the lease still holds
    durable_env.advance_time("15s")
    record_ = durable.get_run(run.id)
    assert record_.status == "completed"
    assert record_.recovery_attempts == 0  # reset by the successful turn
    assert RAN == ["a", "b"]


class WorkerDied(_ControlFlow):
    """Stands for the process dying mid-turn: it escapes the engine, leaving the lease held
    (control flow, as no step or body handler may turn a dying process into a failure)."""


CRASH = {"on": True}


@durable.step(local=True)
def maybe_crash():
    if CRASH["on"]:
        raise WorkerDied()
    return "survived"


@durable.workflow(name="tests.engine_crash_loop")
def crash_loop_flow(ctx, _):
    return ctx.step(maybe_crash)


@override_settings(DURABLE={"MAX_RECOVERY_ATTEMPTS": 2})
def test_crash_loop_goes_dead_past_max_recovery_attempts(durable_env):
    CRASH["on"] = True
    run = durable.start(crash_loop_flow)
    with pytest.raises(WorkerDied):
        durable_env.run_until_idle()
    for recovery in (1, 2):
        with pytest.raises(WorkerDied):
            durable_env.advance_time("31s")  # the lease expires, the orphan sweep re-drives it
        assert durable.get_run(run.id).recovery_attempts == recovery
    durable_env.advance_time("31s")
    record_ = durable.get_run(run.id)
    assert record_.status == "dead"
    assert record_.error["code"] == "max_recovery_attempts"
    with pytest.raises(durable.RunFailed):
        durable.result(run.id)
    CRASH["on"] = False
    durable.retry(run.id)
    assert durable.get_run(run.id).recovery_attempts == 0
    durable_env.run_until_idle()
    assert durable.result(run.id) == "survived"


def test_duplicate_step_delivery_runs_and_records_once(durable_env):
    run = durable.start(simple_flow)
    durable_env.run_next()
    (message,) = durable_env.pending()
    durable_env.run_next()
    assert steps.run_step(*message.args) == "stale"
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["a", "b"]
    assert RAN == ["a", "b"]


def test_duplicate_advance_is_harmless(durable_env):
    run = durable.start(simple_flow)
    durable_env.run_until_idle()
    assert turn.advance(run.id) == "busy"  # finished: nothing to claim
    assert durable.result(run.id) == ["a", "b"]


def test_lost_advance_is_redriven_within_a_lease(durable_env):
    with override_settings(DURABLE={"INLINE_NEXT_TURN": False}):
        run = durable.start(simple_flow)
        durable_env.run_next()  # turn: dispatch step a
        durable_env.run_next()  # step a runs, sends advance
        assert [m.task for m in durable_env.drop()] == ["durable.advance"]
        durable_env.advance_time("29s")
        assert durable.get_run(run.id).status == "suspended"
        durable_env.advance_time("1s")
        assert durable.result(run.id) == ["a", "b"]
        assert RAN == ["a", "b"]


def test_lost_first_turn_is_redriven(durable_env):
    run = durable.start(simple_flow)
    durable_env.drop()
    durable_env.advance_time("5m")
    assert durable.result(run.id) == ["a", "b"]


def test_lost_step_message_is_sent_again_and_runs_once(durable_env):
    run = durable.start(simple_flow)
    durable_env.run_next()
    assert [m.task for m in durable_env.drop()] == ["durable.run_step"]
    durable_env.advance_time("5m")
    assert durable.result(run.id) == ["a", "b"]
    assert RAN == ["a", "b"]


def test_crash_between_commit_and_publish_is_repaired(durable_env):
    with durable_env.broker_down():
        run = durable.start(simple_flow)  # committed, but its message never leaves
    assert durable_env.pending() == []
    assert durable.get_run(run.id).status == "pending"
    durable_env.advance_time("5m")
    assert durable.result(run.id) == ["a", "b"]


def test_worker_without_the_workflow_code_leaves_the_run_alone(durable_env):
    run = Run.objects.create(
        id="from-the-future",
        workflow="tests.engine_unknown",
        version="1",
        queue="durable",
        created_at=durable_env.now(),
        updated_at=durable_env.now(),
    )
    assert turn.advance(run.id) == "parked"
    record_ = durable.get_run(run.id)
    assert record_.status == "suspended" and record_.locked_by is None
    assert record_.wake_at == durable_env.now() + timedelta(minutes=5)


def test_repeated_timer_sweeps_do_not_resend_a_woken_run(durable_env):
    run = durable.start(simple_flow, delay="1h")
    Run.objects.filter(id=run.id).update(wake_at=durable_env.now())
    assert sweeps.sweep_timers() == 1
    assert sweeps.sweep_timers() == 0
    assert [m.args for m in durable_env.pending()] == [(run.id,)]


def _due_runs(count, now, **fields):
    fields = {"status": "suspended", "wake_at": now - timedelta(seconds=1), **fields}
    name = fields.pop("id", "due")
    Run.objects.bulk_create(
        Run(id=f"{name}-{i}", workflow="x", version="1", queue="q", created_at=now, updated_at=now, **fields)
        for i in range(count)
    )


def test_a_timer_sweep_takes_the_most_overdue_runs_first(transactional_db):
    now = clock.now()
    for late in [3, 9, 1, 7, 5]:
        _due_runs(1, now, wake_at=now - timedelta(minutes=late), id=f"late-{late}")
    taken = Run.objects.take_due(now, now + timedelta(minutes=5), 3, status="suspended")
    assert sorted(run_id for run_id, *_ in taken) == ["late-5-0", "late-7-0", "late-9-0"]
    assert sorted(was_due for *_, was_due in taken) == [now - timedelta(minutes=m) for m in (9, 7, 5)]
    # The next batch starts where this one ended: at the latest due time it took.
    after = max((was_due, run_id) for run_id, _, was_due in taken)
    rest = Run.objects.take_due(now, now + timedelta(minutes=5), 3, status="suspended", after=after)
    assert sorted(run_id for run_id, *_ in rest) == ["late-1-0", "late-3-0"]


def _takes_due(sql: str) -> bool:
    """A batch of the timer pass that takes due runs (not its look for debounced runs to admit)."""
    return "ORDER BY" in sql and "debounce_key" not in sql


@override_settings(DURABLE={"TIMER_BATCH_SIZE": 4})
def test_a_pass_over_a_backlog_wakes_each_run_once_batch_after_batch(durable_env):
    now = clock.now()
    for i in range(10):
        _due_runs(1, now, wake_at=now - timedelta(seconds=100), id=f"backlog-{i}")  # all due at once
    _due_runs(1, now, id="starting", status="pending")
    with CaptureQueriesContext(connection) as captured:
        assert sweeps.sweep_timers() == 11
    batches = [q["sql"] for q in captured.captured_queries if _takes_due(q["sql"])]
    # suspended: 4, 4, 2 (each after the first bounded by the one before); pending: 1
    assert len(batches) == 4
    assert ["(wake_at, id) >" in sql for sql in batches] == [False, True, True, False]
    woken = [run_id for message in durable_env.pending() for run_id in dispatch.woken(message)]
    assert sorted(woken) == sorted([f"backlog-{i}-0" for i in range(10)] + ["starting-0"])
    assert sweeps.sweep_timers() == 0


@override_settings(DURABLE={"TIMER_BATCH_SIZE": 2})
def test_a_backlog_longer_than_a_pass_is_read_once_and_a_run_due_behind_is_not_left(durable_env, monkeypatch):
    monkeypatch.setattr(sweeps, "MAX_BATCHES", 2)
    now = clock.now()
    _due_runs(9, now, wake_at=now - timedelta(seconds=100), id="backlog")  # due at once: id order

    def a_pass():
        with CaptureQueriesContext(connection) as captured:
            woken = sweeps.sweep_timers()
        resumed = ["(wake_at, id) >" in q["sql"] for q in captured.captured_queries if _takes_due(q["sql"])]
        return woken, resumed

    # Each pass after the first goes on from where the one before stopped, not from the head.
    assert a_pass() == (4, [False, True])
    assert a_pass() == (4, [True, True])
    # A run that fell due behind that point (as if timed by a clock running late) ...
    _due_runs(1, now, wake_at=now - timedelta(seconds=100), id="backlog-0-behind")
    # ... is taken when a pass reaches the end of the backlog and goes over the head again.
    assert a_pass() == (2, [True, False])
    assert sweeps.sweep_timers() == 0
    woken = [run_id for message in durable_env.pending() for run_id in dispatch.woken(message)]
    assert sorted(woken) == sorted([f"backlog-{i}" for i in range(9)] + ["backlog-0-behind-0"])
    assert sweeps._resume == {}


def test_a_timer_batch_commits_without_waiting_for_the_disk_on_postgres(
    postgres, transactional_db, durable_env
):
    # Its writes are hints: a batch a crash loses is due again, and the next pass takes it again.
    _due_runs(2, clock.now())
    with CaptureQueriesContext(connection) as captured:
        assert sweeps.sweep_timers() == 2
    statements = [q["sql"] for q in captured.captured_queries]
    at = statements.index("SET LOCAL synchronous_commit TO OFF")
    assert statements[at - 1] == "BEGIN" and "ORDER BY" in statements[at + 1]  # the batch's own
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)  # for that transaction alone


def test_concurrent_timer_sweeps_split_the_batch_on_postgres(postgres, transactional_db):
    now = clock.now()
    _due_runs(10, now)
    taken: dict[str, list[str]] = {}
    first_has_rows = threading.Event()
    second_done = threading.Event()

    def sweep(name, wait_for):
        try:
            with transaction.atomic():
                until = clock.now() + timedelta(minutes=5)
                taken[name] = [run_id for run_id, *_ in Run.objects.take_due(clock.now(), until, 6)]
                first_has_rows.set()
                if wait_for:
                    wait_for.wait(10)
        finally:
            connections.close_all()

    first = threading.Thread(target=sweep, args=("first", second_done))
    first.start()
    first_has_rows.wait(10)
    second = threading.Thread(target=sweep, args=("second", None))
    second.start()
    second.join(10)
    second_done.set()
    first.join(10)
    assert len(taken["first"]) == 6
    assert len(taken["second"]) == 4
    assert not set(taken["first"]) & set(taken["second"])
    # Once both committed, nothing is due any more: no third sweep sends them again.
    assert Run.objects.take_due(clock.now(), clock.now(), 10) == []
    assert connection.vendor == "postgresql"


def _race(sweep, runs=2):
    """Run ``sweep`` in ``runs`` threads at once; return every message they published."""
    from durable import dispatch

    sent: list = []
    start = threading.Barrier(runs)

    def one():
        try:
            start.wait(10)
            sweep()
        finally:
            connections.close_all()

    with dispatch.using(dispatch.Transport(send=sent.append)):
        threads = [threading.Thread(target=one) for _ in range(runs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    return sent


@override_settings(DURABLE={"TIMER_BATCH_SIZE": 25})
def test_two_concurrent_timer_sweeps_never_wake_a_run_twice(postgres, transactional_db):
    _due_runs(400, clock.now())
    sent = _race(sweeps.sweep_timers)
    woken = [run_id for message in sent for run_id in dispatch.woken(message)]
    assert sorted(woken) == sorted(f"due-{i}" for i in range(400))


@override_settings(DURABLE={"TIMER_BATCH_SIZE": 25})
def test_two_concurrent_orphan_sweeps_recover_each_run_once(postgres, transactional_db):
    now = clock.now()
    _due_runs(300, now, status="running", locked_by="dead-host:1/x", locked_until=now - timedelta(seconds=1))
    sent = _race(sweeps.sweep_orphans)
    woken = [run_id for message in sent for run_id in dispatch.woken(message)]
    assert sorted(woken) == sorted(f"due-{i}" for i in range(300))
    counted = Run.objects.values_list("status", "recovery_attempts", "locked_by").distinct()
    assert list(counted) == [("suspended", 1, None)]


def test_manage_py_durable_sweep_wakes_due_runs(durable_env):
    from io import StringIO

    from django.core.management import call_command

    run = durable.start(simple_flow, delay="1h")
    Run.objects.filter(id=run.id).update(wake_at=durable_env.now())
    out = StringIO()
    call_command("durable", "sweep", stdout=out)
    assert "woke 1 due run," in out.getvalue()
    assert [m.args for m in durable_env.pending()] == [(run.id,)]


def test_every_sweep_is_a_celery_task_on_the_beat_schedule():
    from celery import current_app

    from durable.celery import beat_schedule
    from durable.engine.sweeps import SWEEPS

    assert set(beat_schedule()) == {sweep.task for sweep in SWEEPS}
    assert all(sweep.task in current_app.tasks for sweep in SWEEPS)


def test_worker_that_does_not_serve_the_runs_queue_sends_the_next_turn_there(durable_env):
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, {"other-queue"}
    try:
        run = durable.start(simple_flow)
        durable_env.run_next()  # the turn dispatches step a
        durable_env.run_next()  # step a is recorded; the next turn is sent, not run here
    finally:
        transport.served_queues = served
    assert [(m.task, m.args) for m in durable_env.pending()] == [("durable.advance", (run.id,))]
