"""Steps run by a Celery worker that has neither durable nor a database (tests/e2e/plain_worker.py).

The plain worker consumes queue ``plain`` only and is started with no database settings at all;
durable's own worker (the ``durable_worker`` fixture) consumes ``durable`` and records what the
plain worker reports: Celery's ``link`` / ``link_error`` callbacks, and ``durable.heartbeat``
messages the plain tasks send by name.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import current_app, shared_task
from django.conf import settings
from django.test import override_settings

import durable
from durable.models import Checkpoint
from durable.processes import CeleryProcess
from durable.testing import _purge, settings_env, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
]

SETTINGS = {"STEP_REDISPATCH_AFTER": "2s", "TIMER_SWEEP_INTERVAL": "0.5s", "ORPHAN_SWEEP_INTERVAL": "1s"}


@durable.step(name="tests.e2e_remote_double", remote=True, queue="plain")
def remote_double(x):
    raise AssertionError("runs on the plain worker only")


@durable.step(
    name="tests.e2e_remote_stuck",
    remote=True,
    queue="plain",
    heartbeat_timeout="2s",
    retry=durable.Retry(max_attempts=3, initial="0.5s"),
)
def remote_stuck(x):
    raise AssertionError("runs on the plain worker only")


# The plain worker's tasks are known here by name only (their code lives there); Celery routes
# them to its queue, as a project would with task_routes. Set on import, so the durable worker,
# which imports this module, routes them too.
current_app.conf.task_routes = {"plain.*": {"queue": "plain"}}


@durable.workflow(name="tests.e2e_plain_tasks")
def plain_tasks(ctx, n):
    total = ctx.step("plain.add", n, b=1)
    try:
        ctx.step("plain.boom", "no luck")
        failure = None
    except durable.StepFailed as exc:
        failure = {"code": exc.code, "message": exc.message}
    return {"total": total, "failure": failure, "long": ctx.step("plain.long", 5)}


@shared_task(name="tests.e2e_durable_side_boom")
def durable_side_boom():
    raise ValueError("failed where durable is installed")


@durable.workflow(name="tests.e2e_durable_side_failure")
def durable_side_failure(ctx, _):
    try:
        ctx.step(durable_side_boom)
    except durable.StepFailed as exc:
        return exc.message


@durable.workflow(name="tests.e2e_remote_steps")
def remote_steps(ctx, x):
    return ctx.step(remote_double, x)


@durable.workflow(name="tests.e2e_remote_stuck")
def remote_stuck_flow(ctx, x):
    return ctx.step(remote_stuck, x)


@pytest.fixture
def durable_worker_options():
    return {"env": settings_env(SETTINGS)}


@pytest.fixture(autouse=True)
def short_intervals():
    with override_settings(DURABLE=SETTINGS):
        yield


class PlainWorkers:
    """Plain Celery workers on queue ``plain``, their environment stripped of any database setting."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.runs = workdir / "runs.log"
        self.runs.touch()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "DJANGO_", "DATABASE"))}
        env["CELERY_BROKER_URL"] = settings.CELERY_BROKER_URL
        env["PLAIN_WORKER_LOG"] = str(self.runs)
        env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
        self.env = env
        self.processes: list[CeleryProcess] = []

    def start(self, name: str) -> CeleryProcess:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.e2e.plain_worker",
            "worker",
            "--loglevel=INFO",
            "--pool=prefork",
            "--concurrency=2",
            "-Q",
            "plain",
            "-n",
            f"plain-{os.getpid()}-{name}@%h",
            "--without-gossip",
            "--without-mingle",
        ]
        process = CeleryProcess(argv, self.env, self.workdir / f"{name}.log", "ready.")
        self.processes.append(process)
        process.start()
        assert "plain worker modules: no durable, no Django settings or ORM" in process.log()
        return process

    def lines(self) -> list[str]:
        return self.runs.read_text().splitlines()

    def close(self) -> None:
        for process in self.processes:
            process.stop()


@pytest.fixture
def plain(durable_worker, redis_broker, postgres) -> Iterator[PlainWorkers]:
    _purge(["plain"])
    workers = PlainWorkers(Path(tempfile.mkdtemp(prefix="plain-worker-")))
    try:
        yield workers
    finally:
        workers.close()


def test_plain_tasks_record_success_failure_and_a_long_heartbeating_step_is_sent_once(durable_worker, plain):
    durable_worker.start_beat()
    plain.start("a")
    run = durable.start(plain_tasks, 1)
    result = durable.result(run.id, timeout=90)
    assert result["total"] == 2
    assert result["failure"]["code"] == "task_failed"
    assert result["long"] == "done"
    # Five seconds of a task whose message would be sent again after two, had its beats not
    # marked it started.
    assert [line for line in plain.lines() if line.startswith("long")] == ["long 1"]
    row = Checkpoint.objects.get(run_id=run.id, name="plain.long")
    assert row.attempt == 1 and row.progress is not None and row.started_at is not None


def test_remote_steps_run_to_completion_and_a_duplicated_result_changes_nothing(durable_worker, plain):
    plain.start("a")
    run = durable.start(remote_steps, 21)
    assert durable.result(run.id, timeout=60) == 42
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    # The beat and the result are two messages: the beat may be applied after the result.
    wait_for(lambda: Checkpoint.objects.get(pk=row.pk).progress == {"x": 21}, timeout=10, what="the beat")
    duplicate = {"run_id": run.id, "seq": 0, "attempt": 1, "token": row.token, "output": 666}
    current_app.send_task("durable.step_result", kwargs=duplicate, queue="durable", serializer="json")
    wait_for(lambda: "'stale'" in durable_worker.logs(), timeout=30, what="the duplicate to be refused")
    assert Checkpoint.objects.get(pk=row.pk).output == 42
    assert durable.result(run.id) == 42


def test_a_remote_worker_killed_mid_step_is_recovered_by_a_new_attempt(durable_worker, plain):
    durable_worker.start_beat()
    first = plain.start("a")
    run = durable.start(remote_stuck_flow, 1)
    wait_for(lambda: Path(str(plain.runs) + ".hung").exists(), timeout=60, what="attempt 1 to hang")
    # The second worker is up before the first dies: attempt 2 is sent once the beats stop, and a
    # worker still starting when STEP_REDISPATCH_AFTER (2 s here) passes would have it sent again
    # (the bound for an attempt nobody reports started) and run it twice.
    plain.start("b")
    first.kill()
    assert durable.result(run.id, timeout=90) == 101
    assert [line for line in plain.lines() if line.startswith("stuck")] == [
        "stuck 1 attempt 1",
        "stuck 1 attempt 2",
    ]
    row = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert row.attempt == 2 and row.status == "completed"


def test_a_task_failing_where_durable_is_installed_is_recorded_through_a_message(durable_worker):
    # The errback runs in place there and forwards the failure to durable's queue: that worker
    # might have no database.
    run = durable.start(durable_side_failure)
    assert durable.result(run.id, timeout=60) == "failed where durable is installed"
    # The message's task ran the run's last turn itself: the run ends before the task's own line.
    wait_for(
        lambda: re.search(
            r"Task durable\.step_result\[[^]]+\] succeeded in [^:]+: 'failed'", durable_worker.logs()
        ),
        timeout=10,
        what="the failure recorded through durable.step_result",
    )
