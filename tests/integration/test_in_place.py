"""Dispatched steps run in place: inside the turn that awaits them, on a worker of their queue.

The harness sends every step as a message; these tests make it a worker of the "durable" queue.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import shared_task
from django.test import override_settings

import durable
from durable import dispatch
from durable.engine import steps, turn, wake_batches
from durable.errors import _ControlFlow
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

RAN: list[str] = []


class WorkerDied(_ControlFlow):
    """Stands for the process dying mid-step: nothing after it runs, the lease stays held
    (control flow, as no step or body handler may turn a dying process into a failure)."""


@pytest.fixture
def env(durable_env, monkeypatch):
    """The harness, as a worker that consumes the "durable" queue."""
    RAN.clear()
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})
    return durable_env


@durable.step(name="tests.in_place.noted")
def noted(name):
    RAN.append(name)
    return name


@durable.step(name="tests.in_place.flaky", retry=durable.Retry(max_attempts=3, initial="10s"))
def flaky(name):
    RAN.append(name)
    if RAN.count(name) < 2:
        raise ConnectionError("try again")
    return name


@durable.step(name="tests.in_place.dies_once")
def dies_once(name):
    RAN.append(name)
    durable.heartbeat({"attempt": RAN.count(name)})
    if RAN.count(name) == 1:
        raise WorkerDied()
    return name


@durable.step(name="tests.in_place.loses_lease")
def loses_lease(run_id):
    RAN.append("ran")
    Run.objects.filter(id=run_id).update(locked_by="someone-else")
    return "late"


@durable.step(name="tests.in_place.wakes_its_run")
def wakes_its_run(run_id):
    RAN.append("ran")
    durable.signal(run_id, "poke")  # a wake lands while the turn holds the run: its settle is refused
    return "done"


@durable.step(name="tests.in_place.cancels")
def cancels(run_id):
    durable.cancel(run_id)
    return "after the cancel"


@durable.step(name="tests.in_place.bounded", timeout="30s")
def bounded(name):
    RAN.append(name)
    return name


@durable.step(name="tests.in_place.elsewhere", queue="gpu")
def elsewhere(name):
    RAN.append(name)
    return name


@durable.workflow(name="tests.in_place.three")
def three(ctx, _):
    return [ctx.step(noted, "a"), ctx.step(noted, "b"), ctx.step(noted, "c")]


@durable.workflow(name="tests.in_place.retrying")
def retrying(ctx, _):
    return ctx.step(flaky, "x")


@durable.workflow(name="tests.in_place.crashing")
def crashing(ctx, _):
    return [ctx.step(noted, "before"), ctx.step(dies_once, "x")]


@durable.workflow(name="tests.in_place.zombie")
def zombie(ctx, _):
    return ctx.step(loses_lease, ctx.run_id)


@durable.workflow(name="tests.in_place.zombie_of_two")
def zombie_of_two(ctx, _):
    ctx.step(loses_lease, ctx.run_id)
    return ctx.step(noted, "second")


@durable.workflow(name="tests.in_place.woken")
def woken(ctx, _):
    return ctx.step(wakes_its_run, ctx.run_id)


@durable.workflow(name="tests.in_place.cancelled")
def cancelled(ctx, _):
    ctx.step(cancels, ctx.run_id)
    return ctx.step(noted, "never")


@durable.workflow(name="tests.in_place.mixed")
def mixed(ctx, _):
    fan = ctx.all([ctx.defer(noted, "fan1"), ctx.defer(noted, "fan2")])
    return [*fan, ctx.step(bounded, "timed"), ctx.step(elsewhere, "gpu"), ctx.step(noted, "here")]


def _rows(run_id):
    return {row.seq: row for row in Checkpoint.objects.filter(run_id=run_id)}


def test_steps_of_a_served_queue_run_inside_the_turn_with_no_message(env):
    run = durable.start(three)
    assert [m.task for m in env.pending()] == [dispatch.ADVANCE]
    env.run_next()
    assert durable.get_run(run.id).status == "completed"
    assert durable.result(run.id) == ["a", "b", "c"]
    assert env.pending() == []
    assert RAN == ["a", "b", "c"]
    for row in _rows(run.id).values():
        # On record as started here, never enqueued: that is how a later turn tells an in-place
        # attempt from one a worker took off the broker.
        assert (row.status, row.attempt) == ("completed", 1)
        assert row.enqueued_at is None and row.started_at is not None and row.finished_at is not None


def test_a_failed_attempt_waits_out_its_backoff_then_runs_in_place_again(env):
    run = durable.start(retrying)
    env.run_next()
    row = _rows(run.id)[0]
    assert (row.status, row.attempt, row.error["type"]) == ("pending", 2, "ConnectionError")
    assert durable.get_run(run.id).status == "suspended"
    env.advance_time("5s")
    assert RAN == ["x"]  # still in its backoff
    env.advance_time("8s")  # 10 s plus up to 20% jitter
    assert durable.result(run.id) == "x"
    assert RAN == ["x", "x"]
    assert (_rows(run.id)[0].status, _rows(run.id)[0].attempt) == ("completed", 2)


def test_a_turn_that_dies_mid_step_is_recovered_and_the_step_runs_again(env):
    run = durable.start(crashing)
    with pytest.raises(WorkerDied):
        turn.advance(run.id)
    row = _rows(run.id)[1]
    # Written as started before it ran, so its death is known to be this attempt's.
    assert (row.status, row.attempt) == ("pending", 1)
    assert row.started_at is not None and row.enqueued_at is None
    assert durable.get_run(run.id).status == "running"  # the dead turn's lease, until it expires
    env.advance_time("31s")  # past the lease: the orphan sweep takes the run back
    lost = _rows(run.id)[1]
    assert (lost.status, lost.attempt, lost.error["code"]) == ("pending", 2, "worker_lost")
    assert durable.get_run(run.id).recovery_attempts == 0  # the step's death, not the run's crash
    env.advance_time("2s")  # the retry's backoff
    assert durable.result(run.id) == ["before", "x"]
    # The step before was recorded and not run again; the one that died ran again as attempt 2.
    assert RAN == ["before", "x", "x"]
    done = _rows(run.id)[1]
    assert (done.status, done.attempt, done.progress) == ("completed", 2, {"attempt": 2})


DIED: list[bool] = []


@durable.workflow(name="tests.in_place.dies_after_a_step")
def dies_after_a_step(ctx, _):
    first = ctx.step(noted, "a")
    if not DIED:
        DIED.append(True)
        raise WorkerDied()  # the process ends after the step ran, before the turn wrote again
    return [first, ctx.step(noted, "b")]


def test_a_result_held_for_the_next_write_is_lost_with_its_process_and_the_step_runs_again(env):
    DIED.clear()
    run = durable.start(dies_after_a_step)
    with pytest.raises(WorkerDied):
        turn.advance(run.id)
    row = _rows(run.id)[0]
    # Its result waited for the turn's next write, which never came: the attempt is as it was
    # written before it ran, and counts as lost once the dead turn's lease expires.
    assert (row.status, row.attempt, row.output) == ("pending", 1, None)
    env.advance_time("31s")
    lost = _rows(run.id)[0]
    assert (lost.status, lost.attempt, lost.error["code"]) == ("pending", 2, "worker_lost")
    env.advance_time("2s")
    assert durable.result(run.id) == ["a", "b"]
    assert RAN == ["a", "a", "b"]


def test_a_step_run_in_place_by_a_turn_that_lost_its_lease_records_nothing(env):
    run = durable.start(zombie)
    assert turn.advance(run.id) == "lost"
    assert RAN == ["ran"]
    # Its result, fenced by the lease it no longer held, was refused: the attempt stays as it
    # was written before it ran, for the next holder of the lease to count as lost.
    (row,) = _rows(run.id).values()
    assert (row.status, row.output, row.attempt) == ("pending", None, 1)


def test_a_result_and_the_next_start_written_by_a_turn_that_lost_its_lease_are_both_refused(env):
    """The result of a step run in place and the next step's start are one write (one statement
    on PostgreSQL): fenced together, neither lands, and the next step never runs here."""
    run = durable.start(zombie_of_two)
    assert turn.advance(run.id) == "lost"
    assert RAN == ["ran"]
    (row,) = _rows(run.id).values()
    assert (row.seq, row.status, row.output, row.attempt) == (0, "pending", None, 1)


def test_a_result_whose_settle_a_wake_refused_stands_and_the_step_does_not_run_again(env):
    run = durable.start(woken)
    env.run_until_idle()
    assert durable.result(run.id) == "done"
    assert RAN == ["ran"]
    (row,) = _rows(run.id).values()
    assert (row.status, row.attempt, row.output) == ("completed", 1, "done")


def test_a_cancel_during_an_in_place_step_wins(env):
    run = durable.start(cancelled)
    env.run_until_idle()
    assert durable.get_run(run.id).status == "cancelled"
    (row,) = _rows(run.id).values()
    assert (row.status, row.output) == ("pending", None)  # its result came after the cancel
    assert RAN == []


def test_fans_and_other_queues_still_go_through_the_broker_and_timed_steps_run_in_place(env):
    run = durable.start(mixed)
    env.run_next()
    sent = [(m.task, m.queue) for m in env.pending()]
    assert sent == [(dispatch.RUN_STEP, "durable"), (dispatch.RUN_STEP, "durable")]
    env.run_next()
    env.run_next()  # the fan closes; the next turn runs the step with a timeout in place
    assert [(m.task, m.queue) for m in env.pending()] == [(dispatch.RUN_STEP, "gpu")]
    env.run_until_idle()
    assert durable.result(run.id) == ["fan1", "fan2", "timed", "gpu", "here"]
    rows = _rows(run.id)
    assert [rows[seq].enqueued_at is None for seq in sorted(rows)] == [False, False, True, False, True]


@override_settings(DURABLE={"EAGER_STEPS": False})
def test_eager_steps_can_be_turned_off(env):
    run = durable.start(three)
    env.run_next()
    assert [m.task for m in env.pending()] == [dispatch.RUN_STEP]
    env.run_until_idle()
    assert durable.result(run.id) == ["a", "b", "c"]


@shared_task(name="tests.in_place.limited", time_limit=60, soft_time_limit=50)
def limited():
    return dispatch.time_limit()


@shared_task(name="tests.in_place.unlimited")
def unlimited():
    return dispatch.time_limit()


def test_the_time_limit_of_the_running_celery_task_is_seen():
    assert limited.apply().get() == 50.0
    assert unlimited.apply().get() is None
    assert dispatch.time_limit() is None  # no task at all


@shared_task(name="tests.in_place.step_with_long_limit", time_limit=120)
def step_with_long_limit(run_id, seq, attempt, token):
    return steps.run_step(run_id, seq, attempt, token)


@shared_task(name="tests.in_place.step_with_short_limit", time_limit=20)
def step_with_short_limit(run_id, seq, attempt, token):
    return steps.run_step(run_id, seq, attempt, token)


@pytest.mark.parametrize(("task", "inline"), [(step_with_long_limit, True), (step_with_short_limit, False)])
def test_the_next_turn_runs_inline_only_with_a_lease_of_the_step_time_limit_left(durable_env, task, inline):
    run = durable.start(three)
    durable_env.run_next()
    (message,) = durable_env.drop()  # the first step's message: run it as a worker would
    task.apply(message.args).get()
    if inline:  # the next turn ran here and sent the second step
        assert [(m.task, m.args[1]) for m in durable_env.pending()] == [(dispatch.RUN_STEP, 1)]
    else:  # less than a LEASE (30 s) of the limit left: the next turn goes to a worker
        assert [m.task for m in durable_env.pending()] == [dispatch.ADVANCE]
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["a", "b", "c"]


def test_no_step_runs_in_place_outside_a_worker(env, monkeypatch):
    monkeypatch.setattr(env.transport, "served_queues", set())
    run = durable.start(three)
    env.run_next()
    assert [m.task for m in env.pending()] == [dispatch.RUN_STEP]
    assert Checkpoint.objects.get(run_id=run.id).enqueued_at is not None


LONG: dict[str, object] = {}


@durable.step(name="tests.in_place.long")
def long_step():
    LONG["tick"](timedelta(minutes=20))  # twenty minutes of work, on the frozen clock
    return "done"


@durable.workflow(name="tests.in_place.long_flow")
def long_flow(ctx, _):
    first = ctx.step(long_step)
    ctx.now()  # a primitive after the step: where a turn past its limit would be stopped
    return first


@override_settings(DURABLE={"TURN_TIME_LIMIT": "15m"})
def test_a_step_run_in_place_does_not_count_against_the_turn_time_limit(env):
    LONG["tick"] = env._freezer.tick
    run = durable.start(long_flow)
    env.drop()
    assert turn.advance(run.id) == "completed"  # in one turn, not stopped after the step
    assert durable.result(run.id) == "done"


BEHIND: dict[str, object] = {}


@durable.step(name="tests.in_place.looks_behind")
def looks_behind(n):
    """Notes which runs' turns were already on their way when this body began."""
    env = BEHIND["env"]
    BEHIND.setdefault("seen", []).append(sorted(r for m in env.pending() for r in dispatch.woken(m)))
    return n


@durable.workflow(name="tests.in_place.one_step")
def one_step(ctx, n):
    return ctx.step(looks_behind, n)


@durable.workflow(name="tests.in_place.naps")
def naps(ctx, n):
    ctx.sleep("1m")
    return n


@pytest.mark.parametrize("redelivered", [False, True], ids=["delivered", "redelivered"])
def test_the_turns_behind_one_that_runs_a_step_in_place_leave_before_the_step(env, redelivered):
    """A loop of starts leaves as one ``advance_batch``: the turns behind one that is about to run
    a body in place go on in messages of their own, so no run waits for another's step."""
    BEHIND.clear()
    BEHIND["env"] = env
    napper = durable.start(naps, 0).id
    ids = [durable.start(one_step, n).id for n in range(1, 4)]
    env.drop()
    # The napping turn runs no body: the batch goes on past it at no cost of a message.
    assert wake_batches.advance_batch([napper, *ids], redelivered=redelivered) == ["suspended", "completed"]
    # On their way when the first body began (a redelivered batch also sends each run it turns
    # again, for the sends the process that died may have left unpublished):
    assert set(ids[1:]) <= set(BEHIND["seen"][0])
    if not redelivered:
        assert BEHIND["seen"][0] == sorted(ids[1:])
        assert [m.task for m in env.pending()] == [dispatch.ADVANCE, dispatch.ADVANCE]
    env.run_until_idle()
    assert [durable.result(run_id) for run_id in ids] == [1, 2, 3]
    assert RAN == []  # each body ran once, in its own run's turn
    assert Checkpoint.objects.filter(run_id__in=ids, attempt=1, status="completed").count() == 3


def test_the_last_turn_of_a_batch_runs_its_step_in_place_with_nothing_to_send(env):
    BEHIND.clear()
    BEHIND["env"] = env
    ids = [durable.start(naps, 0).id, durable.start(one_step, 1).id]
    env.drop()
    assert wake_batches.advance_batch(ids) == ["suspended", "completed"]
    assert env.pending() == []
