"""``ctx.signal`` / ``ctx.start`` / ``ctx.publish_event`` exactly once under SIGKILLed workers: a
turn killed before its commit sends nothing, a replay after the commit sends nothing again."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.models import Event, Run, Signal
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MARKS = Path(tempfile.gettempdir()) / "durable-e2e-messages"


@pytest.fixture
def durable_worker_options():
    # A restart under the same INSTANCE_ID takes the killed worker's runs back at once. A prompt
    # the killed worker had reserved is lost with it (Redis gives it back only after its
    # visibility timeout): beat's timer sweep re-drives its run within a LEASE, shortened here.
    return {"env": {"DURABLE_INSTANCE_ID": "messages-test-w1", "DURABLE_LEASE": "3s"}}


def starts(run_id: str, label: str) -> int:
    path = MARKS / f"{run_id}-{label}"
    return len(path.read_text().split()) if path.exists() else 0


@durable.step(local=True)
def hang_the_first_time(run_id: str, label: str) -> str:
    MARKS.mkdir(exist_ok=True)
    with open(MARKS / f"{run_id}-{label}", "a") as f:
        f.write(f"{time.time()}\n")
    if starts(run_id, label) == 1:
        time.sleep(60)  # the worker is killed here, mid-turn, holding the run's lease
    return label


@durable.workflow(name="tests.e2e_messages.receiver")
def receiver(ctx, _):
    return ctx.wait_for_signal("hello")


@durable.workflow(name="tests.e2e_messages.sender")
def sender(ctx, target):
    ctx.signal(target, "hello", "once")
    started = ctx.start(receiver, None)
    ctx.publish_event("tests.e2e_messages.sent", {"from": ctx.run_id})
    ctx.step(hang_the_first_time, ctx.run_id, "before-commit")  # messages only in memory yet
    ctx.step(hang_the_first_time, ctx.run_id, "after-commit")  # messages committed with step one
    return started


def _sent(target: str) -> tuple[int, int, int]:
    return (
        Signal.objects.filter(run_id=target).count(),
        Run.objects.filter(workflow="tests.e2e_messages.receiver").exclude(id=target).count(),
        Event.objects.filter(name="tests.e2e_messages.sent").count(),
    )


def test_messages_go_exactly_once_across_worker_kills(durable_worker):
    durable_worker.start_beat()
    target = durable.start(receiver)
    run = durable.start(sender, target.id)
    wait_for(lambda: starts(run.id, "before-commit") == 1, 60, what="the first turn to hang")
    assert _sent(target.id) == (0, 0, 0)
    durable_worker.kill()
    durable_worker.restart()
    wait_for(lambda: starts(run.id, "after-commit") == 1, 60, what="the second turn to hang")
    assert _sent(target.id) == (1, 1, 1)
    durable_worker.kill()
    durable_worker.restart()
    started = durable.result(run.id, timeout=60)
    assert durable.result(target.id, timeout=30) == "once"
    assert _sent(target.id) == (1, 1, 1)
    assert Run.objects.get(id=started).parent_id is None
