"""Work wider than one statement's parameters: PostgreSQL's protocol takes at most 65,535 per
statement, so every write whose size grows with the work is cut into slices (``models.base``).
Each test here failed with "number of parameters must be between 0 and 65535" without them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import durable
from durable import clock
from durable.engine import redispatch, retention
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

WIDE = 10_000


@durable.step
def member(i):
    return i


@durable.workflow(name="tests.wide_fan")
def wide_fan(ctx, n):
    return sum(ctx.map(member, range(n)))


def test_a_fan_of_ten_thousand_runs_to_completion(durable_env, postgres):
    """The first turn writes 10,000 positions of 25 columns each: in slices, in its transaction."""
    run_id = durable.start(wide_fan, WIDE).id
    durable_env.run_until_idle(max_tasks=3 * WIDE)
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    assert run.output == sum(range(WIDE))
    assert Checkpoint.objects.filter(run_id=run_id, fan__isnull=False, status="completed").count() == WIDE


#: More ids than one statement's parameters can name.
PAST_ONE_STATEMENT = 66_000


def _tree(root_id, children, *, status="completed"):
    """A finished root run with ``children`` finished child runs (as a fan of children leaves)."""
    now = clock.now()
    common = {"workflow": "tests.wide_tree", "version": "1", "queue": "durable", "created_at": now}
    done = {"status": status, "updated_at": now, "finished_at": now - timedelta(days=40)}
    Run.objects.create(id=root_id, **common, **done)
    Checkpoint.objects.create(run_id=root_id, seq=0, kind="child", name="c", status="completed")
    Run.objects.bulk_create(
        (
            Run(id=f"{root_id}-{i}", parent_id=root_id, parent_seq=i, **common, **done)
            for i in range(children)
        ),
        batch_size=2000,
    )


def test_deleting_a_run_with_a_fan_of_children_deletes_them_all(durable_env, postgres):
    _tree("wide", PAST_ONE_STATEMENT)
    assert durable.delete_run("wide") == PAST_ONE_STATEMENT + 1
    assert not Run.objects.exists()
    assert not Checkpoint.objects.exists()


def test_retention_deletes_a_tree_with_a_fan_of_children(durable_env, postgres):
    _tree("wide", PAST_ONE_STATEMENT)
    with override_settings(DURABLE={"RETENTION": [{"max_age": "30d"}]}):
        assert retention.sweep_retention() == PAST_ONE_STATEMENT + 1
    assert not Run.objects.exists()


def test_retrying_a_run_whose_wide_fan_failed_gives_every_member_a_fresh_attempt(durable_env, postgres):
    now = clock.now()
    seqs = list(range(PAST_ONE_STATEMENT))
    Run.objects.create(
        id="failed",
        workflow=wide_fan.name,
        version=wide_fan.version,
        queue="durable",
        status="failed",
        failed_seqs=seqs,
        created_at=now,
        updated_at=now,
        finished_at=now,
    )
    Checkpoint.objects.bulk_create(
        (
            Checkpoint(run_id="failed", seq=seq, kind="step", name=member.name, status="failed", fan=0)
            for seq in seqs
        ),
        batch_size=2000,
    )
    durable.retry("failed")
    assert Run.objects.get(id="failed").status == "pending"
    assert not Checkpoint.objects.filter(run_id="failed").exists()


def test_redispatching_more_runs_than_one_statement_names(durable_env, postgres):
    run_id = durable.start(wide_fan, 2).id
    durable_env.run_next()  # the first turn sends both members
    assert len(durable_env.drop()) == 2  # and the broker loses their messages
    others = [f"gone-{i}" for i in range(PAST_ONE_STATEMENT)]
    assert redispatch.redispatch([*others, run_id]) == 2
    durable_env.run_until_idle()
    assert Run.objects.get(id=run_id).output == 1
