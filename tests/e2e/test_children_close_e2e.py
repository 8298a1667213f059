"""Children that follow their parent, on a real worker SIGKILLed while the parent runs a step:
once the parent ends after the restart, its "cancel" child is cancelled, its "interrupt" child
cleans up in ``finally`` then ends cancelled, and its "abandon" child runs on."""

from __future__ import annotations

import time

import pytest

import durable
from durable.models import Checkpoint, Run
from durable.testing import wait_for
from tests.e2e.conftest import settings_fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s", "RECONCILE_INTERVAL": "5s"}
durable_worker_options, short_lease = settings_fixtures(SETTINGS)


@durable.step
def tidy(name: str) -> str:
    return f"tidied {name}"


@durable.step
def slow() -> str:
    time.sleep(1.5)  # long enough to be killed in
    return "done"


@durable.workflow(name="tests.e2e_children_close.waiter")
def waiter(ctx, name):
    try:
        return ctx.wait_for_signal("go")
    finally:
        ctx.step(tidy, name)


@durable.workflow(name="tests.e2e_children_close.parent")
def parent(ctx, _):
    ids = [
        ctx.start_child(waiter, policy, on_parent_close=policy)
        for policy in ("cancel", "interrupt", "abandon")
    ]
    ctx.step(slow)
    return ids


def test_children_follow_their_parent_through_a_worker_sigkill(durable_worker):
    durable_worker.start_beat()
    run = durable.start(parent)
    wait_for(
        lambda: Checkpoint.objects.filter(run_id=run.id, kind="step", started_at__isnull=False).exists(),
        timeout=30,
        what="the parent's slow step to start",
    )
    durable_worker.kill()
    durable_worker.restart()
    cancel, interrupt, abandon = durable.result(run.id, timeout=60)
    wait_for(
        lambda: Run.objects.get(id=interrupt).status == "cancelled",
        timeout=30,
        what="the interrupted child to clean up and end",
    )
    assert Run.objects.get(id=cancel).status == "cancelled"
    # The interrupted child's cleanup step ran once, in its finally, before it ended.
    tidied = Checkpoint.objects.filter(run_id=interrupt, kind="step", status="completed")
    assert list(tidied.values_list("output", flat=True)) == ["tidied interrupt"]
    # The abandoned child runs on. Its first turn may not have run yet: a turn message the killed
    # worker had prefetched comes back with the reconcile sweep (RECONCILE_INTERVAL).
    wait_for(
        lambda: Run.objects.get(id=abandon).status == "suspended",
        timeout=30,
        what="the abandoned child to wait for its signal",
    )
    durable.signal(abandon, "go", "still here")
    assert durable.result(abandon, timeout=30) == "still here"
