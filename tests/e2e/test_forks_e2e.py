"""End to end: a failed run forked at its failing step on a real worker, the worker SIGKILLed
in the middle of the fork's step, then restarted. The steps before the fork's position never run
again; the fork asked for twice under one id is one run."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from django.test import override_settings

import durable
from durable.models import Checkpoint, Run
from durable.testing import settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DIR = Path(tempfile.gettempdir()) / "durable-forks-e2e"
BROKEN = DIR / "broken"  # while it exists, charging fails: the bug
SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s"}


@pytest.fixture
def durable_worker_options():
    return {"start": False, "env": settings_env(SETTINGS)}


@pytest.fixture(autouse=True)
def short_lease():
    with override_settings(DURABLE=SETTINGS):
        yield


def _note(what: str) -> None:
    info = durable.step_info()
    with open(DIR / info.run_id, "a") as f:
        f.write(f"{what}:{info.attempt}\n")


def noted(run_id: str) -> list[str]:
    path = DIR / run_id
    return path.read_text().split() if path.exists() else []


@durable.step(name="tests.e2e_forks.reserve")
def reserve(order):
    _note("reserve")
    return f"reserved {order}"


@durable.step(name="tests.e2e_forks.charge", retry=durable.Retry(max_attempts=3, initial="1s"))
def charge(order):
    _note("charge")
    if BROKEN.exists():
        raise durable.ApplicationError("the card service refused (a bug since fixed)", non_retryable=True)
    time.sleep(4)  # long enough to be killed in
    return f"charged {order}"


@durable.workflow(name="tests.e2e_forks.order")
def order(ctx, number):
    return [ctx.step(reserve, number), ctx.step(charge, number)]


def test_a_fork_killed_mid_step_reruns_only_from_its_position(durable_worker):
    DIR.mkdir(exist_ok=True)
    BROKEN.touch()
    durable_worker.start_beat()
    durable_worker.primary.start()
    origin = durable.start(order, 7)
    with pytest.raises(durable.RunFailed, match="card service refused"):
        durable.result(origin.id, timeout=60)
    assert noted(origin.id) == ["reserve:1", "charge:1"]

    BROKEN.unlink()
    fork = durable.fork(origin.id, at=1, run_id=f"fix-{origin.id}")
    wait_for(lambda: noted(fork.id), timeout=60, what="the fork's charge step to start")
    durable_worker.kill()
    assert durable.fork(origin.id, at=1, run_id=fork.id).id == fork.id  # the same fork, not another
    durable_worker.restart()
    assert durable.result(fork.id, timeout=90) == ["reserved 7", "charged 7"]
    # The reserve step ran once, in the origin; the killed charge attempt ran again as the next.
    assert noted(fork.id) == ["charge:1", "charge:2"]
    assert noted(origin.id) == ["reserve:1", "charge:1"]
    assert Run.objects.filter(forked_from_id=origin.id).count() == 1
    row = Checkpoint.objects.get(run_id=fork.id, seq=1)
    assert (row.status, row.attempt) == ("completed", 2)
