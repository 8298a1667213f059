"""End to end: two tenants, each with its own worker and beat. Each tenant's runs are executed
only by its own worker, and a beat sweeps only its own tenant's timers."""

from __future__ import annotations

import os

import pytest
from celery import current_app

import durable
from durable.models import Run
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TENANTS = ("tenant-a", "tenant-b")
QUEUES = [f"durable.{tenant}" for tenant in TENANTS]


@pytest.fixture
def durable_worker_options():
    # The primary worker (which would consume every queue) stays down: only the tenants' run.
    # No countdowns: a tenant's timers fire only when its own beat sweeps them.
    return {
        "start": False,
        "env": {"DURABLE_TIMER_SWEEP_INTERVAL": "200ms", "DURABLE_TIMER_HINT_WITHIN": "0s"},
    }


@durable.step(local=True)
def executor() -> str:
    """The tenant of the worker running the turn."""
    return os.environ.get("DURABLE_NAMESPACE", "none")


@durable.step
def dispatched_executor() -> str:
    """The tenant of the worker running a dispatched step."""
    return os.environ.get("DURABLE_NAMESPACE", "none")


@durable.workflow(name="tests.ns_e2e.tenant_flow")
def tenant_flow(ctx: durable.Context, _: object) -> list[str]:
    seen = [ctx.step(executor), ctx.step(dispatched_executor)]
    ctx.sleep("1s")
    return [*seen, ctx.step(executor)]


def _tenant(durable_worker, tenant: str) -> None:
    env = {"DURABLE_NAMESPACE": tenant, "DURABLE_INSTANCE_ID": f"pool-{tenant}"}
    durable_worker.add_worker(env, name=tenant, queues=[f"durable.{tenant}"])


@pytest.mark.parametrize("durable_worker", [QUEUES], indirect=True)
def test_each_tenant_is_run_by_its_own_worker_and_swept_by_its_own_beat(durable_worker):
    for tenant in TENANTS:
        _tenant(durable_worker, tenant)
    durable_worker.start_beat({"DURABLE_NAMESPACE": "tenant-b"}, name="beat-b")
    runs = {tenant: [durable.start(tenant_flow, namespace=tenant).id for _ in range(3)] for tenant in TENANTS}

    # Only tenant-b's beat runs: its runs wake from their timers, tenant-a's stay asleep.
    for run_id in runs["tenant-b"]:
        assert durable.result(run_id, timeout=60) == ["tenant-b"] * 3
    asleep = Run.objects.filter(id__in=runs["tenant-a"])
    assert set(asleep.values_list("status", flat=True)) == {"suspended"}
    assert all(run.wake_at is not None for run in asleep)

    durable_worker.start_beat({"DURABLE_NAMESPACE": "tenant-a"}, name="beat-a")
    for run_id in runs["tenant-a"]:
        assert durable.result(run_id, timeout=60) == ["tenant-a"] * 3


@durable.workflow(name="tests.ns_e2e.short_flow")
def short_flow(ctx: durable.Context, _: object) -> list[str]:
    return [ctx.step(executor), ctx.step(dispatched_executor)]


@pytest.mark.parametrize("durable_worker", [QUEUES], indirect=True)
def test_a_turn_misrouted_to_another_tenant_is_refused_and_left_to_its_own(durable_worker):
    _tenant(durable_worker, "tenant-a")
    run_id = durable.start(short_flow, namespace="tenant-b").id  # its own worker is not up yet
    misrouted = current_app.send_task("durable.advance", args=[run_id], queue="durable.tenant-a").id
    wait_for(
        lambda: f"[{misrouted}] succeeded" in durable_worker.logs() or None,
        30,
        what="tenant-a's worker to handle the misrouted turn",
    )
    assert "refused a turn of run" in durable_worker.logs()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.locked_by, run.started_at) == ("pending", None, None)

    _tenant(durable_worker, "tenant-b")
    assert durable.result(run_id, timeout=60) == ["tenant-b"] * 2
