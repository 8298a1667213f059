"""``@durable.workflow(concurrency=...)``: at most N runs of a workflow in flight (per key of the
input with ``durable.Concurrency``); later runs wait pending and are admitted in start order."""

from __future__ import annotations

import pytest

import durable
from durable.errors import InvalidInput

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.quota.two", concurrency=2)
def two(ctx, job):
    return ctx.wait_for_signal("go")


@durable.workflow(name="tests.quota.keyed", concurrency=durable.Concurrency(limit=1, key="{customer}"))
def keyed(ctx, job):
    return ctx.wait_for_signal("go")


def _admitted(handles):
    return [durable.get_run(h.id).admitted for h in handles]


def test_runs_beyond_the_limit_wait_and_are_admitted_in_start_order(durable_env):
    handles = [durable.start(two, n) for n in range(4)]
    durable_env.run_until_idle()
    assert _admitted(handles) == [True, True, False, False]
    assert [durable.get_run(h.id).status for h in handles[2:]] == ["pending", "pending"]
    durable.signal(handles[1].id, "go", "done")
    durable_env.run_until_idle()
    assert _admitted(handles) == [True, True, True, False]  # the older waiter first
    durable.cancel(handles[0].id)
    durable_env.run_until_idle()
    assert _admitted(handles) == [True, True, True, True]
    for h in handles[2:]:
        durable.signal(h.id, "go", h.id)
    durable_env.run_until_idle()
    assert [durable.get_run(h.id).status for h in handles] == [
        "cancelled",
        "completed",
        "completed",
        "completed",
    ]


def test_a_keyed_quota_bounds_each_key_apart(durable_env):
    ann, bob, ann_again = (durable.start(keyed, {"customer": c}) for c in ("ann", "bob", "ann"))
    durable_env.run_until_idle()
    assert _admitted([ann, bob, ann_again]) == [True, True, False]


def test_a_workflow_takes_concurrency_or_singleton_not_both():
    with pytest.raises(InvalidInput, match="not both"):
        durable.workflow(
            name="tests.quota.both", concurrency=2, singleton=durable.Singleton(key="{customer}")
        )(lambda ctx, job: None)


@pytest.mark.parametrize("bad", [0, "3", 2.5, durable.Retry()])
def test_a_bad_workflow_concurrency_is_refused_at_declaration(bad):
    with pytest.raises(InvalidInput, match="concurrency"):
        durable.workflow(name="tests.quota.bad", concurrency=bad)(lambda ctx, job: None)
