"""End to end: real ``celery worker`` and ``celery beat`` subprocesses on the configured stack.

The worker imports this module (durable_worker passes ``--include``), so the workflows below are
registered on both sides. Steps log their executions to files, a ledger that outlives workers.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.models import Checkpoint
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEDGER = Path(tempfile.gettempdir()) / "durable-e2e-ledger"


def ledger(run_id: str) -> list[str]:
    path = LEDGER / run_id
    return path.read_text().split() if path.exists() else []


def _log(event: str) -> None:
    LEDGER.mkdir(exist_ok=True)
    info = durable.step_info()
    with open(LEDGER / info.run_id, "a") as f:
        f.write(f"{event}:{info.seq}:{info.attempt}\n")


@durable.step
def quick(value):
    _log("quick")
    return value


@durable.step(timeout="3s", retry=durable.Retry(max_attempts=3, initial="200ms"))
def slow(seconds):
    _log("start")
    time.sleep(seconds)
    _log("end")
    return "slept"


@durable.step
def slow_eager(seconds):
    """No timeout: a worker of its queue runs it eagerly, inside the turn."""
    _log("start")
    durable.heartbeat("started")  # writes the attempt's row, so the test can see it run in place
    time.sleep(seconds)
    _log("end")
    return "slept"


@durable.step(timeout="1s", retry=durable.Retry(max_attempts=2, initial="100ms"))
def overruns():
    _log("overrun")
    time.sleep(10)


@durable.workflow(name="tests.e2e_overrun")
def overrun_flow(ctx, _):
    return ctx.step(overruns)


@durable.workflow(name="tests.e2e_kill")
def kill_flow(ctx, seconds):
    return [ctx.step(quick, "before"), ctx.step(slow, seconds), ctx.step(quick, "after")]


@durable.workflow(name="tests.e2e_kill_eager")
def kill_eager_flow(ctx, seconds):
    return [ctx.step(quick, "before"), ctx.step(slow_eager, seconds), ctx.step(quick, "after")]


@durable.workflow(name="tests.e2e_early_signal")
def early_signal_flow(ctx, seconds):
    ctx.step(slow, seconds)
    return ctx.wait_for_signal("go", timeout="1m")


@durable.workflow(name="tests.e2e_event")
def event_flow(ctx, order):
    return [ctx.wait_for_event("e2e.paid", match={"order": order}), ctx.wait_for_event("e2e.shipped")]


@durable.step(local=True)
def note(path, event):
    with open(path, "a") as f:
        f.write(f"{event}\n")


@durable.workflow(name="tests.e2e_singleton", singleton=durable.Singleton(key="{account}"))
def singleton_flow(ctx, job):
    ctx.step(note, job["ledger"], f"start {job['n']}")
    go = ctx.wait_for_signal("go")
    ctx.step(note, job["ledger"], f"end {job['n']}")
    return [job["n"], go]


@durable.workflow(name="tests.e2e_timer")
def timer_flow(ctx, seconds):
    ctx.step(quick, "before")
    ctx.sleep(seconds)
    return "rang"


@durable.step
def heap_seen():
    return {"pid": os.getpid(), "frozen": gc.get_freeze_count()}


@durable.workflow(name="tests.e2e_heap")
def heap_flow(ctx, _):
    return ctx.step(heap_seen)


def test_a_pool_process_runs_with_the_workers_startup_objects_frozen(durable_worker):
    # FREEZE_GC_AT_START (default True): Django, the project's modules and durable's registries,
    # built before the pool forked, are out of the collector's sight in the pool process.
    seen = durable.result(durable.start(heap_flow).id, timeout=60)
    assert seen["pid"] in durable_worker.primary.pool_pids()
    assert seen["frozen"] > 50_000, seen


def test_example_workflow_completes(durable_worker):
    durable_worker.start_beat()
    order = {"id": 1, "items": [{"sku": "a", "cents": 500, "qty": 2}], "cooling_off": "1s"}
    run = durable.start("shop.fulfil", order)
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=run.id, kind="signal").exists(), 60, what="the approval wait"
    )
    durable.signal(run.id, "approve", {"address": "1 Main St, Springfield"})
    output = durable.result(run.id, timeout=60)
    assert output["cents"] == 1000 and output["tracking"] == "TRACK-1-SPRINGFIELD"
    charge = Checkpoint.objects.get(run_id=run.id, name="shop.charge_card")
    assert (charge.status, charge.attempt) == ("completed", 2)  # one durable retry


def test_worker_killed_mid_step_resumes_after_restart_and_records_once(durable_worker):
    durable_worker.start_beat()
    run = durable.start(kill_flow, 2.0)
    wait_for(lambda: "start:1:1" in ledger(run.id), 60, what="the slow step to start")
    durable_worker.kill()  # SIGKILL the worker and its pool: the step dies mid-flight
    assert "end:1:1" not in ledger(run.id)
    durable_worker.restart()
    assert durable.result(run.id, timeout=90) == ["before", "slept", "after"]
    rows = list(Checkpoint.objects.filter(run_id=run.id).values_list("seq", "status"))
    assert rows == [(0, "completed"), (1, "completed"), (2, "completed")]
    events = ledger(run.id)
    # The killed attempt started and never ended; a later attempt ran it to the end, once.
    assert events.count("start:1:1") == 1 and "end:1:1" not in events
    assert sum(e.startswith("end:1:") for e in events) == 1
    print(f"ledger of the killed step: {[e for e in events if ':1:' in e]}")


def test_worker_killed_mid_eager_step_runs_it_again_and_records_once(durable_worker):
    durable_worker.start_beat()
    run = durable.start(kill_eager_flow, 2.0)
    wait_for(lambda: "start:1:1" in ledger(run.id), 60, what="the slow step to start")
    wait_for(lambda: Checkpoint.objects.filter(run_id=run.id, seq=1).exists(), 10, what="its heartbeat")
    row = Checkpoint.objects.get(run_id=run.id, seq=1)
    # Run eagerly, inside the turn: on record as started, never enqueued; the turn holds the lease.
    assert (row.status, row.enqueued_at is None, row.started_at is not None) == ("pending", True, True)
    assert durable.get_run(run.id).status == "running"
    durable_worker.kill()  # SIGKILL the worker and its pool: the turn and its step die
    assert "end:1:1" not in ledger(run.id)
    durable_worker.restart()
    assert durable.result(run.id, timeout=90) == ["before", "slept", "after"]
    events = ledger(run.id)
    # The step recorded before the kill did not run again; the killed attempt counts as lost and
    # the next one ran to its end once; every position is recorded once.
    assert events.count("quick:0:1") == 1 and events.count("quick:2:1") == 1
    assert events.count("start:1:1") == 1 and "end:1:1" not in events
    assert events.count("start:1:2") == 1 and events.count("end:1:2") == 1
    rows = list(Checkpoint.objects.filter(run_id=run.id).values_list("seq", "status", "attempt"))
    assert rows == [(0, "completed", 1), (1, "completed", 2), (2, "completed", 1)]
    print(f"ledger of the eager run: {events}")


def test_signal_sent_before_the_wait_is_not_lost(durable_worker):
    run = durable.start(early_signal_flow, 0.5)
    durable.signal(run.id, "go", {"early": True})
    assert durable.result(run.id, timeout=60) == {"early": True}


def test_events_reach_waiting_runs_across_processes(durable_worker):
    durable.publish_event("e2e.shipped", {"carrier": "post"})  # kept for the wait that comes later
    runs = [durable.start(event_flow, order) for order in (1, 2)]
    wait_for(
        lambda: Checkpoint.objects.filter(kind="event", status="pending").count() == 2,
        60,
        what="both runs waiting for their payment",
    )
    durable.publish_event("e2e.paid", {"order": 2})
    assert durable.result(runs[1].id, timeout=30) == [{"order": 2}, {"carrier": "post"}]
    assert durable.get_run(runs[0].id).status == "suspended"
    durable.publish_event("e2e.paid", {"order": 1})
    assert durable.result(runs[0].id, timeout=30) == [{"order": 1}, {"carrier": "post"}]


def test_a_singleton_key_runs_one_at_a_time_across_processes(durable_worker, tmp_path):
    path = str(tmp_path / "singleton-ledger")
    first, second = (durable.start(singleton_flow, {"account": "a1", "n": n, "ledger": path}) for n in (1, 2))
    wait_for(lambda: durable.get_run(first.id).status == "suspended", 60, what="the first run to wait")
    time.sleep(1)
    assert (durable.get_run(second.id).status, durable.get_run(second.id).admitted) == ("pending", False)
    durable.signal(second.id, "go", "second")  # buffered while it waits for its slot
    durable.signal(first.id, "go", "first")
    assert durable.result(first.id, timeout=30) == [1, "first"]
    assert durable.result(second.id, timeout=30) == [2, "second"]
    # The second's body began only once the first had ended (its timestamps may not show it:
    # a claim waiting on SQLite's write lock stamps the time it asked).
    assert Path(path).read_text().split("\n") == ["start 1", "end 1", "start 2", "end 2", ""]


def test_two_second_timer_fires_within_three_seconds_of_due(durable_worker):
    durable_worker.start_beat()
    run = durable.start(timer_flow, 2)
    assert durable.result(run.id, timeout=60) == "rang"
    timer = Checkpoint.objects.get(run_id=run.id, kind="sleep")
    late = (timer.finished_at - timer.wake_at).total_seconds()
    print(f"2 s timer fired {late:.2f} s after its due time")
    assert 0 <= late <= 3


def test_step_timeout_fails_the_attempt_on_a_real_worker(durable_worker):
    durable_worker.start_beat()
    run = durable.start(overrun_flow)
    with pytest.raises(durable.RunFailed) as failure:
        durable.result(run.id, timeout=60)
    assert failure.value.code == "timeout"
    step = Checkpoint.objects.get(run_id=run.id)
    assert (step.status, step.attempt, step.error["type"]) == ("failed", 2, "StepTimeout")
    assert ledger(run.id) == ["overrun:0:1", "overrun:0:2"]
