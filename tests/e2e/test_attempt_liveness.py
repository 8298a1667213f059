"""Every step attempt is held by a live process: real workers, steps whose process dies, results
that fail to record, interrupts inside steps. Each run must end, with the real cause on record.

Steps end their process with ``os._exit`` (what the kernel's OOM killer leaves behind: no
exception, no ``finally``). A ledger file per run, written before each step's work, counts how
many times each attempt ran.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.models import Checkpoint
from durable.testing import wait_for
from tests.e2e.conftest import settings_fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEDGER = Path(tempfile.gettempdir()) / "durable-liveness-ledger"
# A short lease, so a dead holder is known in seconds; the same in the workers and beat.
SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s"}
TWICE = durable.Retry(max_attempts=2, initial="100ms")

durable_worker_options, short_lease = settings_fixtures(SETTINGS)


def ran(run_id: str) -> list[str]:
    path = LEDGER / run_id
    return path.read_text().split() if path.exists() else []


def _note(event: str) -> None:
    LEDGER.mkdir(exist_ok=True)
    info = durable.step_info()
    with open(LEDGER / info.run_id, "a") as f:
        f.write(f"{event}:{info.attempt}\n")


@durable.step(timeout="5s", retry=TWICE)
def dies_dispatched():
    """Awaited in a fan: it always crosses the broker."""
    _note("dies")
    os._exit(1)


@durable.step(retry=TWICE)
def dies_in_place():
    """Awaited on its own: a worker of its queue runs it inside the turn."""
    _note("dies")
    os._exit(1)


@durable.step(timeout="30s", heartbeat_timeout="20s", retry=TWICE)
def dies_in_place_timed():
    """Timed steps run inside the turn too, under durable's own time limits."""
    _note("dies")
    os._exit(1)


@durable.step(timeout="30s")
def cuts_its_connection():
    """The database drops this worker's connection while the step runs, as a restart would."""
    from django.db import DEFAULT_DB_ALIAS, connections

    _note("cuts")
    own = connections[DEFAULT_DB_ALIAS]
    with own.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    return "kept"


@durable.step(timeout="30s", retry=durable.Retry(max_attempts=1))
def interrupted():
    _note("interrupted")
    raise KeyboardInterrupt("stop right there")


@durable.step(timeout="30s")
def fine():
    return "fine"


@durable.workflow(name="tests.liveness.fine")
def fine_flow(ctx, _):
    return ctx.step(fine)


@durable.workflow(name="tests.liveness.dispatched")
def dispatched_flow(ctx, _):
    return ctx.all([ctx.defer(dies_dispatched)])[0]


@durable.workflow(name="tests.liveness.in_place")
def in_place_flow(ctx, _):
    return ctx.step(dies_in_place)


@durable.workflow(name="tests.liveness.in_place_timed")
def in_place_timed_flow(ctx, _):
    return ctx.step(dies_in_place_timed)


@durable.workflow(name="tests.liveness.cut")
def cut_flow(ctx, _):
    return ctx.all([ctx.defer(cuts_its_connection)])[0]  # a fan: dispatched, recorded by run_step


@durable.workflow(name="tests.liveness.interrupted")
def interrupted_flow(ctx, _):
    return ctx.step(interrupted)


def _ended(run_id: str, timeout: float):
    return wait_for(
        lambda: (r := durable.get_run(run_id)).status in ("completed", "failed", "dead", "cancelled") and r,
        timeout,
        what=f"run {run_id} to end",
    )


@pytest.mark.parametrize(
    "flow",
    [dispatched_flow, in_place_flow, in_place_timed_flow],
    ids=["dispatched", "in place", "in place, timed"],
)
def test_a_step_whose_process_dies_counts_as_a_lost_attempt_and_the_run_ends(durable_worker, flow):
    durable_worker.start_beat()
    began = time.monotonic()
    run = durable.start(flow, None)
    ended = _ended(run.id, 90)
    print(f"{flow.name}: ended {ended.status} in {time.monotonic() - began:.1f}s, ledger {ran(run.id)}")
    assert ended.status == "failed", ended.error  # not dead: the step's death is the step's
    assert ended.error["code"] == "worker_lost"
    # Each attempt ran once: a redelivered message never runs a dead attempt again as itself.
    assert ran(run.id) == ["dies:1", "dies:2"]
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (row.status, row.attempt, row.error["type"]) == ("failed", 2, "WorkerLost")


def test_a_result_whose_connection_was_cut_is_still_recorded_once(durable_worker, postgres):
    run = durable.start(cut_flow, None)
    assert durable.result(run.id, timeout=60) == "kept"
    assert ran(run.id) == ["cuts:1"]
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (row.status, row.attempt) == ("completed", 1)
    # Recorded on a connection checked after the step's body (the server's goodbye is on the
    # cut socket by then), or, when the check came first, by the retry after the first try met
    # the cut: either way once.


def test_keyboard_interrupt_in_a_step_fails_the_attempt_with_its_cause(durable_worker):
    run = durable.start(interrupted_flow, None)
    ended = _ended(run.id, 60)
    assert ended.status == "failed"
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (row.status, row.error["type"], row.error["message"]) == (
        "failed",
        "KeyboardInterrupt",
        "stop right there",
    )
    assert ran(run.id) == ["interrupted:1"]
    # The worker lives on and serves the next run.
    assert durable.result(durable.start(fine_flow, None).id, timeout=60) == "fine"
