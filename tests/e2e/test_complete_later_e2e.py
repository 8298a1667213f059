"""A step completed from outside on real workers: the attempt that raised CompleteLater outlives
its worker (it is held by no process, so no restart or sweep counts it lost), and the token
settles it from another process."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

import durable
from durable.models import Checkpoint
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TOKENS = Path(tempfile.gettempdir()) / "durable-e2e-complete-later"


@pytest.fixture
def durable_worker_options():
    # A restart under the same INSTANCE_ID lets go of every hold its predecessor had at once.
    return {"env": {"DURABLE_INSTANCE_ID": "complete-later-w1", "DURABLE_LEASE": "2s"}}


@durable.step
def ask_a_human(order: int) -> None:
    TOKENS.mkdir(exist_ok=True)
    info = durable.step_info()
    (TOKENS / info.run_id).write_text(info.token)
    raise durable.CompleteLater()


@durable.workflow(name="tests.e2e_complete_later")
def approval(ctx, order):
    return {"order": order, "answer": ctx.step(ask_a_human, order)}


def test_an_attempt_completed_later_survives_its_worker_and_settles_once(durable_worker):
    run = durable.start(approval, 3)
    token_file = TOKENS / run.id
    wait_for(token_file.exists, 60, what="the step to hand out its token")
    # Let go: no process holds it, and it is open as if sent (a step run in place is written so only
    # once it raised CompleteLater; before that, its turn's lease holds it and a kill loses it).
    wait_for(
        lambda: Checkpoint.objects.filter(
            run_id=run.id, seq=0, held_by=None, enqueued_at__isnull=False
        ).exists(),
        30,
        what="the let-go",
    )
    durable_worker.kill()
    durable_worker.restart()
    durable_worker.start_beat()
    wait_for(lambda: durable.get_run(run.id).status == "suspended", 30, what="the run to rest")
    time.sleep(3)  # more than a lease, with beat's orphan sweeps running
    position = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (position.status, position.attempt) == ("pending", 1)
    durable.complete_step(token_file.read_text(), "approved")
    assert durable.result(run.id, timeout=30) == {"order": 3, "answer": "approved"}
    with pytest.raises(durable.DurableError, match="settled already"):
        durable.complete_step(token_file.read_text(), "again")
