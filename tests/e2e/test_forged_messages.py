"""Messages published to the broker by someone who knows no token change nothing.

A forger who can publish to the broker and has guessed a run's id, a step's position and its
attempt number sends ``durable.step_result`` and ``durable.heartbeat`` for an ordinary durable step
(not a Celery task used as a step) while the real step runs. The run must complete with the real
output, and neither the forged output nor the forged progress may ever be stored.

The worker imports this module (``--include``), so the workflows are registered on both sides.
Each real step holds until the test releases it, so the forged message is handled while its
attempt is pending and started.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import current_app

import durable
from durable import conf
from durable.models import TERMINAL, Checkpoint, Run
from durable.testing import DurableWorker, _purge, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

GATE_ENV = "FORGED_MESSAGES_GATE"
HOLD_AT_MOST = 60  # seconds a step holds its worker process if the test never releases it
FORGED_PROGRESS_BYTES = 20 * 1024 * 1024
REMOTE_QUEUE = "forged-remote"  # consumed by no worker: its attempts are reported by the test


def _hold_until_released() -> None:
    """Say this attempt started, then hold it until the test touches its release file."""
    gate = Path(os.environ[GATE_ENV])
    info = durable.step_info()
    (gate / f"{info.run_id}.started").write_text(str(info.attempt))
    deadline = time.monotonic() + HOLD_AT_MOST
    while not (gate / f"{info.run_id}.release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@durable.step(timeout="2m")
def held_with_timeout(tag):
    """A timeout keeps it off the eager path: a worker runs it from a ``run_step`` message."""
    _hold_until_released()
    return {"real": tag}


@durable.step
def held(tag):
    _hold_until_released()
    return {"real": tag}


@durable.workflow(name="tests.forged_dispatched")
def dispatched_flow(ctx, tag):
    return ctx.step(held_with_timeout, tag)


@durable.workflow(name="tests.forged_fan_member")
def fan_member_flow(ctx, tag):
    return ctx.map(held, [tag])[0]  # fan members are always dispatched


@durable.workflow(name="tests.forged_in_place")
def in_place_flow(ctx, tag):
    return ctx.step(held, tag)  # no timeout, on a worker of its queue: run inside the turn


@durable.step(
    name="tests.forged_remote",
    remote=True,
    queue=REMOTE_QUEUE,
    retry=durable.Retry(max_attempts=3, initial="60s"),
)
def remote_step(tag):
    raise AssertionError("no worker here serves the remote queue: the test reports for it")


@durable.workflow(name="tests.forged_remote_flow")
def remote_flow(ctx, tag):
    return ctx.step(remote_step, tag)


@pytest.fixture
def gate() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="durable-forged-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def durable_worker_options(gate):
    return {"env": {GATE_ENV: str(gate)}}


def forge(task: str, **kwargs: Any) -> str:
    """Publish ``task`` as anyone with access to the broker could; return the message's id."""
    return current_app.send_task(task, kwargs=kwargs, queue=conf.get().DEFAULT_QUEUE).id


def handled(worker: DurableWorker, task_id: str) -> str | None:
    """The worker's log line saying how it ended the message ``task_id``, once there is one."""
    for line in worker.logs().splitlines():
        if f"[{task_id}]" in line and not line.rstrip().endswith("received"):
            return line
    return None


def start_and_wait_until_running(gate: Path, flow: Any) -> str:
    run_id = durable.start(flow, "x").id
    wait_for(lambda: (gate / f"{run_id}.started").exists(), 60, what="the real step to start")
    return run_id


def forged_values(run_id: str) -> list[tuple[int, str, Any]]:
    """The run's positions whose output or progress came from a forger."""
    rows = Checkpoint.objects.filter(run_id=run_id).values_list("seq", "output", "progress")
    return [
        (seq, field, value)
        for seq, output, progress in rows
        for field, value in (("output", output), ("progress", progress))
        if isinstance(value, dict) and "forged" in value
    ]


@pytest.mark.parametrize("flow", [dispatched_flow, fan_member_flow, in_place_flow], ids=lambda f: f.name)
def test_forged_step_result_for_an_ordinary_step_changes_nothing(
    postgres, server_broker, durable_worker, gate, flow
):
    run_id = start_and_wait_until_running(gate, flow)
    try:
        forged = forge("durable.step_result", run_id=run_id, seq=0, attempt=1, output={"forged": True})
        line = wait_for(
            lambda: handled(durable_worker, forged), 30, what="the worker to handle the forged message"
        )
        run = Run.objects.get(id=run_id)
        assert run.status not in TERMINAL, (
            f"the forged step_result ended the run: {run.status} {run.output} ({line})"
        )
        assert not forged_values(run_id), f"the forged output was stored: {forged_values(run_id)} ({line})"
    finally:
        (gate / f"{run_id}.release").touch()
    assert durable.result(run_id, timeout=30) == {"real": "x"}
    assert list(Checkpoint.objects.filter(run_id=run_id).values_list("seq", "status", "output")) == [
        (0, "completed", {"real": "x"})
    ]


def test_forged_heartbeat_does_not_store_twenty_megabytes_of_progress(
    postgres, server_broker, durable_worker, gate
):
    run_id = start_and_wait_until_running(gate, dispatched_flow)
    try:
        forged = forge(
            "durable.heartbeat",
            run_id=run_id,
            seq=0,
            attempt=1,
            progress={"forged": "x" * FORGED_PROGRESS_BYTES},
        )
        line = wait_for(
            lambda: handled(durable_worker, forged), 60, what="the worker to handle the forged message"
        )
        stored = [(seq, field, len(value["forged"])) for seq, field, value in forged_values(run_id)]
        assert not stored, (
            f"the forged progress was stored (position, field, characters): {stored} ({line[:300]})"
        )
    finally:
        (gate / f"{run_id}.release").touch()
    assert durable.result(run_id, timeout=30) == {"real": "x"}
    assert not forged_values(run_id)


def test_a_result_without_a_token_does_not_settle_a_remote_step_in_its_backoff(
    postgres, server_broker, durable_worker
):
    """Between a failed attempt and the next send an attempt has no token: a step_result that
    carries none must not find it equal."""
    run_id = durable.start(remote_flow, "x").id
    try:
        sent = wait_for(
            lambda: Checkpoint.objects.filter(run_id=run_id, seq=0, enqueued_at__isnull=False).first(),
            30,
            what="the remote attempt to be sent",
        )
        # The remote side reports attempt 1 failed, with its token: attempt 2 waits 60s.
        forge(
            "durable.step_result", run_id=run_id, seq=0, attempt=1, error={"message": "no"}, token=sent.token
        )
        wait_for(
            lambda: Checkpoint.objects.filter(run_id=run_id, seq=0, attempt=2, token__isnull=True).exists(),
            30,
            what="attempt 1 to fail into its backoff",
        )
        forged = forge("durable.step_result", run_id=run_id, seq=0, attempt=2, output="FORGED")
        line = wait_for(
            lambda: handled(durable_worker, forged), 30, what="the worker to handle the forged message"
        )
        run = Run.objects.get(id=run_id)
        assert run.status not in TERMINAL, (
            f"the token-less step_result ended the run: {run.status} {run.output} ({line})"
        )
        row = Checkpoint.objects.get(run_id=run_id, seq=0)
        assert (row.status, row.attempt, row.output) == ("pending", 2, None), line
    finally:
        _purge([REMOTE_QUEUE])
