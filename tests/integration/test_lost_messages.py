"""Lost step messages are found without a blind timer: the orphan sweep sends a probe down each
queue holding attempts not taken for a while, and the worker that takes the probe has the
attempts sent before it, and still not taken, sent again at once. A deep queue is not flooded:
its probe arrives behind the backlog. A redispatch budget ends an attempt no worker ever takes.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

import durable
from durable import dispatch
from durable.engine import redispatch, sweeps, turn
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db


@durable.step
def work(n: int) -> int:
    return n + 1


@durable.step(queue="nobody")
def unserved() -> str:
    return "never"


@durable.workflow(name="tests.lost_messages.one")
def one_step(ctx, n):
    return ctx.step(work, n)


@durable.workflow(name="tests.lost_messages.unserved")
def unserved_flow(ctx, _):
    return ctx.step(unserved)


def test_a_lost_step_message_is_sent_again_within_seconds_not_after_step_redispatch_after(durable_env):
    run = durable.start(one_step, 1)
    durable_env.run_next()
    assert [m.task for m in durable_env.drop()] == [dispatch.RUN_STEP]  # the broker lost it
    durable_env.advance_time("3s")  # the orphan sweep's probe overtakes it, and it goes again
    assert durable.result(run.id) == 2
    row = Checkpoint.objects.get(run_id=run.id)
    assert (row.attempt, row.redispatches) == (1, 1)


def test_an_attempt_sent_just_before_the_probe_is_left_alone(durable_env):
    run = durable.start(one_step, 1)
    durable_env.run_next()
    (message,) = durable_env.drop()
    assert redispatch.probed("durable", durable_env.now().isoformat()) == 0  # within the slack
    durable_env.messages.append(message)  # it was on its way after all
    durable_env.run_until_idle()
    assert durable.result(run.id) == 2
    assert Checkpoint.objects.get(run_id=run.id).redispatches == 0


def _backlog(env, count: int) -> list[str]:
    """``count`` runs whose step was sent a minute ago and sits in the queue, not taken yet
    (written as the turns would have; their messages are the broker's, not this test's)."""
    sent = env.now() - timedelta(minutes=1)
    runs = [
        Run(
            id=f"deep-{i}",
            workflow=one_step.name,
            version="1",
            status="suspended",
            input=i,
            queue="durable",
            created_at=sent,
            updated_at=sent,
            wake_at=sent + timedelta(minutes=5),
        )
        for i in range(count)
    ]
    Run.objects.bulk_create(runs, batch_size=2000)
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(
                run_id=run.id,
                seq=0,
                kind="step",
                name=work.name,
                queue="durable",
                input={"args": [i], "kwargs": {}},
                enqueued_at=sent,
                wake_at=sent + timedelta(minutes=5),
                token=f"t{i}",
            )
            for i, run in enumerate(runs)
        ],
        batch_size=2000,
    )
    return [run.id for run in runs]


def test_a_queue_holding_ten_thousand_unstarted_steps_gets_no_duplicate_sends(durable_env):
    ids = _backlog(durable_env, 10_000)
    durable_env.drop()
    probes = []
    for _ in range(3):  # sweep passes over three minutes, all short of STEP_REDISPATCH_AFTER
        durable_env._freezer.tick(timedelta(minutes=1))
        for sweep in sweeps.SWEEPS:
            sweep.run()
        sent = durable_env.drop()
        assert {m.task for m in sent} <= {dispatch.PROBE}, [m.task for m in sent][:5]
        probes += sent
    assert [m.args[0] for m in probes] == ["durable"] * 3  # one probe per queue per pass
    # The broker hands the probes out behind the backlog: by then every step was taken.
    Checkpoint.objects.filter(run_id__in=ids).update(started_at=durable_env.now())
    for probe in probes:
        assert redispatch.probed(*probe.args) == 0
    assert durable_env.drop() == []
    assert not Checkpoint.objects.filter(run_id__in=ids, redispatches__gt=0).exists()


def test_a_flushed_queue_has_every_lost_step_sent_again_once(durable_env):
    ids = _backlog(durable_env, 1200)  # more than a batch
    durable_env.drop()
    sweeps.sweep_orphans()
    (probe,) = durable_env.drop()
    assert probe.task == dispatch.PROBE
    # The queue was flushed: the probe is the first message a worker takes.
    assert redispatch.probed(*probe.args) == 1200
    sent = durable_env.drop()
    assert sorted(run_id for m in sent for run_id in dispatch.woken(m)) == sorted(ids)
    assert redispatch.probed(*probe.args) == 0  # a duplicate probe sends nothing more


@override_settings(DURABLE={"STEP_REDISPATCH_LIMIT": 2})
def test_an_attempt_no_worker_takes_fails_after_the_redispatch_limit(durable_env):
    run = durable.start(unserved_flow)
    durable_env.run_next()
    sends = 0
    while durable.get_run(run.id).status != "failed" and sends < 10:
        # No worker consumes "nobody": its step messages and probes stay untaken.
        sends += len(durable_env.drop(dispatch.RUN_STEP))
        durable_env.drop(dispatch.PROBE)
        durable_env._freezer.tick(timedelta(minutes=5))
        for sweep in sweeps.SWEEPS:
            sweep.run()
        for message in durable_env.drop(dispatch.ADVANCE):
            turn.advance(*message.args)
    assert sends == 3  # sent, then sent again twice
    with pytest.raises(durable.RunFailed) as failure:
        durable.result(run.id)
    assert failure.value.code == "redispatch_limit"
    row = Checkpoint.objects.get(run_id=run.id)
    assert "sent again 2 times and no worker of queue 'nobody' took it" in row.error["message"]
    assert row.error["details"] == {"queue": "nobody", "redispatches": 2}


def test_redispatch_sends_the_untaken_attempts_of_runs_again_with_a_fresh_budget(durable_env):
    run = durable.start(one_step, 1)
    durable_env.run_next()
    (lost,) = durable_env.drop()
    Checkpoint.objects.filter(run_id=run.id).update(redispatches=7)
    assert redispatch.redispatch([run.id, run.id]) == 1
    durable_env.messages.append(lost)  # the old message still arrives: refused, its token changed
    durable_env.run_until_idle()
    assert durable.result(run.id) == 2
    assert Checkpoint.objects.get(run_id=run.id).redispatches == 0
