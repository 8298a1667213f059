"""A sweep's wakes travel as ``durable.advance_batch`` messages through real Redis to a real
worker: a lost batch message costs its runs only the timer sweep's redrive, a batch whose worker
process is SIGKILLed midway is delivered again and every run completes exactly once, and a batch
message durable did not send is refused.

The test process runs the timer sweep itself while no worker consumes, so it knows which batch
messages wait in Redis before a worker takes them. The worker imports this module
(``--include``), so the workflow is registered on both sides.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import current_app
from django.conf import settings
from django.db.models import Max
from django.test import override_settings
from django.utils import timezone

import durable
from durable import conf
from durable.engine import sweeps
from durable.models import TERMINAL, Run
from durable.testing import DurableWorker, flush_broker, settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

GATE_ENV = "WAKE_BATCHES_GATE"
# Only these differ from the defaults, here and (as DURABLE_<KEY>) in the worker and beat: a
# dead turn's lease and a swept run's safety-net wake both come due within seconds, and timers
# send no countdowns (the naps are woken by the sweep's batch messages under test).
SETTINGS = {"LEASE": "3s", "RECONCILE_INTERVAL": "3s", "TIMER_HINT_WITHIN": "0s"}
RUNS = 40  # 16 batch messages of two or three runs


def _gate() -> Path:
    return Path(os.environ[GATE_ENV])


@durable.step(local=True)
def record(n: int) -> int:
    """Leave one line per execution: a run whose step ran twice shows two."""
    with (_gate() / f"{durable.step_info().run_id}.ran").open("a") as ledger:
        ledger.write(f"{n}\n")
    return n


@durable.workflow(name="tests.wake_batches_e2e.nap")
def nap(ctx, n):
    ctx.sleep("1s")
    victim = _gate() / "victim"
    dead = _gate() / "killed"
    if victim.exists() and victim.read_text() == ctx.run_id and not dead.exists():
        # The process dies midway through its batch message, as an OOM kill would end it.
        dead.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return ctx.step(record, n)


@durable.workflow(name="tests.wake_batches_e2e.long_nap")
def long_nap(ctx, _):
    ctx.sleep("1h")


@pytest.fixture
def gate() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="durable-wake-batches-"))
    os.environ[GATE_ENV] = str(path)  # the test process writes the victim's name there
    yield path
    os.environ.pop(GATE_ENV, None)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def durable_worker_options(gate):
    return {"env": {GATE_ENV: str(gate), **settings_env(SETTINGS)}}


@pytest.fixture(autouse=True)
def short_intervals():
    with override_settings(DURABLE=SETTINGS):
        yield


def _waiting_batches() -> list[tuple[str, list[str]]]:
    """The ``durable.advance_batch`` messages waiting in Redis on durable's queue: (id, run ids)."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    out = []
    for raw in client.lrange(conf.get().DEFAULT_QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == "durable.advance_batch":
            args = json.loads(base64.b64decode(message["body"]))[0]
            out.append((message["headers"]["id"], args[0]))
    return out


def _swept_while_no_worker_consumes(worker: DurableWorker) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Runs napping, then due, swept by this process into batch messages that wait in Redis."""
    ids = [durable.start(nap, n).id for n in range(RUNS)]
    wait_for(
        lambda: Run.objects.filter(id__in=ids, status="suspended", wake_at__isnull=False).count() == RUNS,
        60,
        what="every run to nap",
    )
    worker.primary.stop()
    latest = Run.objects.filter(id__in=ids).aggregate(latest=Max("wake_at"))["latest"]
    time.sleep(max(0.0, (latest - timezone.now()).total_seconds()) + 0.2)
    assert sweeps.sweep_timers() == RUNS
    batches = _waiting_batches()
    assert sorted(run_id for _, run_ids in batches for run_id in run_ids) == sorted(ids)
    assert len(batches) == 16
    return ids, batches


def _every_run_completed_once(ids: list[str], gate: Path) -> None:
    wait_for(
        lambda: not Run.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists(),
        90,
        interval=0.5,
        what="every run to finish",
    )
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {"completed"}
    assert [durable.result(run_id) for run_id in ids] == list(range(RUNS))
    ran = {run_id: (gate / f"{run_id}.ran").read_text().split() for run_id in ids}
    assert {run_id: len(lines) for run_id, lines in ran.items() if len(lines) != 1} == {}


def test_runs_whose_batch_message_is_lost_complete_through_the_timer_sweep(
    postgres, redis_broker, durable_worker, gate
):
    ids, _ = _swept_while_no_worker_consumes(durable_worker)
    flush_broker(durable_worker.queues)
    flushed = timezone.now()
    assert _waiting_batches() == []
    durable_worker.primary.start()
    durable_worker.start_beat()
    _every_run_completed_once(ids, gate)
    last = Run.objects.filter(id__in=ids).aggregate(last=Max("finished_at"))["last"]
    print(f"every run done {last - flushed} after the flush")
    # The sweep set each run's timer RECONCILE_INTERVAL ahead: beat's timer sweep sends it again.
    assert (last - flushed).total_seconds() <= 3 + 15


def test_a_batch_whose_process_is_killed_midway_is_delivered_again_and_each_run_completes_once(
    postgres, redis_broker, durable_worker, gate
):
    ids, batches = _swept_while_no_worker_consumes(durable_worker)
    message_id, run_ids = next((m, r) for m, r in batches if len(r) == 3)
    victim = run_ids[1]  # runs before it completed in the dead process, the one after did not
    (gate / "victim").write_text(victim)
    durable_worker.primary.start()
    durable_worker.start_beat()  # the victim's lease lapses; a sweep hands its run back
    _every_run_completed_once(ids, gate)
    assert (gate / "killed").exists(), "the victim's process never died: the test proved nothing"
    logs = durable_worker.logs()
    assert logs.count(f"durable.advance_batch[{message_id}] received") >= 2, "never delivered again"


@pytest.mark.parametrize(
    "run_ids",
    ["{victim}", ["{victim}"] * 1001, ["{victim}", 7]],
    ids=["a string", "too many", "a number"],
)
def test_a_forged_batch_message_is_refused_by_the_worker_and_changes_nothing(durable_worker, run_ids):
    run_id = durable.start(long_nap).id
    wait_for(lambda: Run.objects.get(id=run_id).status == "suspended", 60, what="the run to nap")
    # Accepted, the message would give the run a turn: its lease and updated_at would move.
    before = Run.objects.values().get(id=run_id)
    forged = json.loads(json.dumps(run_ids).replace("{victim}", run_id))
    task_id = current_app.send_task(
        "durable.advance_batch", args=(forged,), queue=conf.get().DEFAULT_QUEUE, serializer="json"
    ).id
    line = wait_for(lambda: _handled(durable_worker, task_id), 30, what="the worker to handle the message")
    assert "refused a durable.advance_batch message: run_ids" in durable_worker.logs(), line
    assert Run.objects.values().get(id=run_id) == before


def _handled(worker: DurableWorker, task_id: str) -> str | None:
    """The worker's log line saying how it ended the message ``task_id``, once there is one."""
    for line in worker.logs().splitlines():
        if f"[{task_id}]" in line and not line.rstrip().endswith("received"):
            return line
    return None
