"""Recovery under injected faults: lease renewal, instance reclaim, parking, dead letters, shutdown."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.test import override_settings

import durable
from durable import celery as durable_celery
from durable import checks as durable_checks
from durable import clock
from durable.engine import leases, sweeps, turn
from durable.models import Checkpoint, Run

pytestmark = pytest.mark.django_db

THIEF: dict[str, bool] = {}


@durable.step
def noop(value):
    return value


@durable.step(local=True)
def long_local(run_id, seconds):
    time.sleep(seconds)
    # Another worker tries to take the run over once the original lease would have expired.
    THIEF["won"] = Run.objects.claim(run_id, "thief/1", clock.now(), timedelta(seconds=30)) is not None
    return "done"


@durable.workflow(name="tests.recovery_long_local")
def long_local_flow(ctx, seconds):
    return ctx.step(long_local, ctx.run_id, seconds)


@durable.workflow(name="tests.recovery_dlq_handler")
def dlq_handler(ctx, letter):
    return {"handled": letter["dead_run_id"], "workflow": letter["workflow"], "code": letter["error"]["code"]}


@durable.workflow(name="tests.recovery_dead_lettered", dead_letter=dlq_handler)
def dead_lettered_flow(ctx, _):
    return ctx.step(noop, 1)


@durable.workflow(name="tests.recovery_plain")
def plain_flow(ctx, _):
    return ctx.step(noop, 1)


def _orphan(run_id, *, owner="dead-worker/1", attempts=0, expired=True):
    now = clock.now()
    Run.objects.filter(id=run_id).update(
        status="running",
        locked_by=owner,
        recovery_attempts=attempts,
        locked_until=now - timedelta(seconds=1) if expired else now + timedelta(seconds=30),
    )


@pytest.mark.django_db(transaction=True)
@override_settings(DURABLE={"LEASE": "1s"})
def test_long_local_step_keeps_its_lease_alive():
    # The step runs three LEASEs; a lease of a second tolerates a loaded machine's stalls.
    now = clock.now()
    Run.objects.create(
        id="long-local",
        workflow=long_local_flow.name,
        version="1",
        queue="durable",
        input=3.0,
        created_at=now,
        updated_at=now,
    )
    assert turn.advance("long-local") == "completed"
    assert THIEF["won"] is False  # the lease was renewed while the step ran past it


def test_orphan_with_a_step_in_flight_is_parked_not_counted(durable_env):
    run = durable.start(plain_flow)
    durable_env.run_next()  # the turn dispatches the step
    durable_env.drop()
    _orphan(run.id)
    assert sweeps.sweep_orphans() == 1
    record = durable.get_run(run.id)
    assert (record.status, record.recovery_attempts, record.locked_by) == ("suspended", 0, None)


def test_restarted_instance_reclaims_its_predecessors_leases_at_once(durable_env):
    booted = durable_env.now()
    mine, renewed, others = (durable.start(plain_flow) for _ in range(3))
    durable_env.drop()
    # Its predecessor's lease is still valid by the clock, but it was last renewed before boot.
    Run.objects.filter(id=mine.id).update(
        status="running", locked_by="pod-7/aaa", locked_until=booted + timedelta(seconds=10)
    )
    # A lease renewed after boot belongs to a live process with the same id: not touched.
    Run.objects.filter(id=renewed.id).update(
        status="running", locked_by="pod-7/bbb", locked_until=booted + timedelta(seconds=31)
    )
    Run.objects.filter(id=others.id).update(
        status="running", locked_by="pod-8/ccc", locked_until=booted + timedelta(seconds=10)
    )
    assert sweeps.reclaim("pod-7", booted) == 1
    assert [m.args for m in durable_env.pending()] == [(mine.id,)]
    durable_env.run_until_idle()
    assert durable.result(mine.id) == 1
    assert Run.objects.get(id=renewed.id).locked_by == "pod-7/bbb"
    assert Run.objects.get(id=others.id).locked_by == "pod-8/ccc"


@override_settings(DURABLE={"MAX_RECOVERY_ATTEMPTS": 1})
def test_dead_run_is_dead_lettered_once(durable_env):
    run = durable.start(dead_lettered_flow, {"order": 5})
    durable_env.drop()
    _orphan(run.id, attempts=1)
    assert sweeps.sweep_orphans() == 1
    assert durable.get_run(run.id).status == "dead"
    durable_env.run_until_idle()
    letter = durable.get_run(f"dlq:{run.id}")
    assert letter.input == {
        "dead_run_id": run.id,
        "workflow": dead_lettered_flow.name,
        "input": {"order": 5},
        "error": durable.get_run(run.id).error,
    }
    assert durable.result(letter.id) == {
        "handled": run.id,
        "workflow": dead_lettered_flow.name,
        "code": "max_recovery_attempts",
    }
    # Dead-lettering again (a second sweep, a replayed death) starts nothing new.
    from durable.engine import lifecycle

    lifecycle.dead_letter(durable.get_run(run.id))
    assert Run.objects.filter(id__startswith="dlq:").count() == 1


@override_settings(DURABLE={"MAX_RECOVERY_ATTEMPTS": 1, "DEAD_LETTER_WORKFLOW": "tests.recovery_dlq_handler"})
def test_default_dead_letter_workflow_applies_and_a_dead_dlq_run_is_not_routed(durable_env):
    run = durable.start(plain_flow)
    durable_env.drop()
    _orphan(run.id, attempts=1)
    sweeps.sweep_orphans()
    durable_env.drop()
    letter_id = f"dlq:{run.id}"
    assert Run.objects.filter(id=letter_id).exists()
    _orphan(letter_id, attempts=1)
    sweeps.sweep_orphans()
    assert durable.get_run(letter_id).status == "dead"
    assert not Run.objects.filter(id=f"dlq:{letter_id}").exists()


@override_settings(DURABLE={"MAX_RECOVERY_ATTEMPTS": 1, "DEAD_LETTER_WORKFLOW": "tests.recovery_missing"})
def test_unregistered_dead_letter_workflow_only_warns(durable_env, caplog):
    run = durable.start(plain_flow)
    durable_env.drop()
    _orphan(run.id, attempts=1)
    sweeps.sweep_orphans()
    assert durable.get_run(run.id).status == "dead"
    assert "could not hand run" in caplog.text


@durable.workflow(name="tests.recovery_parent")
def parent_flow(ctx, _):
    try:
        return ctx.child(plain_flow, None)
    except durable.ChildFailed as exc:
        return {"child failed": exc.code}


@override_settings(DURABLE={"MAX_RECOVERY_ATTEMPTS": 1})
def test_parent_learns_at_once_when_a_child_dies(durable_env):
    parent = durable.start(parent_flow)
    durable_env.run_next()  # the parent's turn starts the child
    (child,) = Run.objects.filter(parent_id=parent.id)
    durable_env.drop()
    _orphan(child.id, attempts=1)  # the child's turns keep crashing
    sweeps.sweep_orphans()
    assert durable.get_run(child.id).status == "dead"
    assert [m.args for m in durable_env.pending()] == [(parent.id,)]  # at once, not at a sweep
    durable_env.run_until_idle()
    assert durable.result(parent.id) == {"child failed": "max_recovery_attempts"}


def test_shutdown_hands_back_the_leases_of_running_turns(durable_env):
    run = durable.start(plain_flow)
    durable_env.drop()
    claimed = Run.objects.claim(run.id, "me/1", durable_env.now(), timedelta(seconds=30))
    leases.active[run.id] = claimed.locked_by  # "me/1", marked as the run's first claim
    try:
        durable_celery._hand_back_leases()
    finally:
        leases.active.pop(run.id, None)
    record = durable.get_run(run.id)
    assert (record.status, record.locked_by) == ("suspended", None)
    durable_env.run_until_idle()
    assert durable.result(run.id) == 1


def test_persisted_heartbeats_from_another_process_keep_a_step_alive(durable_env):
    @durable.step(name="tests.recovery_beating", heartbeat_timeout="20s", retry=durable.Retry(max_attempts=1))
    def beating():
        return "never runs here"

    @durable.workflow(name="tests.recovery_beating_flow")
    def flow(ctx, _):
        return ctx.step(beating)

    run = durable.start(flow)
    durable_env.run_next()
    durable_env.drop()  # the step runs on another worker, which holds it and only beats
    token = Checkpoint.objects.get(run_id=run.id, seq=0).token
    now = durable_env.now()
    assert Checkpoint.objects.take(run.id, 0, 1, token, "elsewhere", now, now + timedelta(seconds=30))
    for _ in range(6):
        durable_env.advance_time("15s")
        now = durable_env.now()
        Checkpoint.objects.renew_hold(run.id, 0, 1, "elsewhere", now + timedelta(seconds=30))
        Checkpoint.objects.beat(run.id, 0, 1, now, None, False)
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("31s")  # silent past heartbeat_timeout + persist throttle
    assert durable.get_run(run.id).status == "failed"


def test_worker_prefetch_defaults_to_one_but_a_chosen_value_is_kept():
    def worker(multiplier):
        consumer = SimpleNamespace(prefetch_multiplier=multiplier, initial_prefetch_count=2 * multiplier)
        return SimpleNamespace(
            prefetch_multiplier=multiplier, concurrency=2, max_concurrency=None, consumer=consumer
        )

    default, chosen = worker(4), worker(8)
    durable_celery._prefetch_one(instance=default)
    durable_celery._prefetch_one(instance=chosen)
    assert (default.prefetch_multiplier, default.consumer.initial_prefetch_count) == (1, 2)
    assert (chosen.prefetch_multiplier, chosen.consumer.initial_prefetch_count) == (8, 16)


def test_check_warns_when_redis_visibility_timeout_is_shorter_than_a_step_timeout():
    from celery import current_app

    @durable.step(name="tests.recovery_very_long", timeout="2h")
    def very_long():
        return None

    # Set as the project's settings name them (CELERY_ namespace): Celery 5.4 reads the
    # namespaced keys before the plain ones, so conf.broker_url = ... would not be seen there.
    conf, url, options = current_app.conf, "CELERY_BROKER_URL", "CELERY_BROKER_TRANSPORT_OPTIONS"
    saved = {key: conf[key] for key in (url, options) if key in conf}
    try:
        conf[url] = "redis://127.0.0.1:6379/0"
        conf[options] = {"visibility_timeout": 3600}
        warnings = durable_checks.check_visibility_timeout()
        conf[options] = {"visibility_timeout": 3 * 3600}
        assert durable_checks.check_visibility_timeout() == []
    finally:
        for key in (url, options):
            conf.pop(key, None)
        conf.update(saved)
        from durable.definitions import registry

        registry.steps.pop("tests.recovery_very_long")
    assert [w.id for w in warnings] == ["durable.W001"]
    assert "tests.recovery_very_long" in warnings[0].msg


class Positive:
    """A minimal input_schema (pydantic's model_validate protocol)."""

    def __init__(self, n):
        self.n = n

    @classmethod
    def model_validate(cls, value):
        if not isinstance(value, dict) or not isinstance(value.get("n"), int) or value["n"] <= 0:
            raise ValueError("n must be a positive int")
        return cls(value["n"])


@durable.workflow(name="tests.recovery_schema", input_schema=Positive)
def schema_flow(ctx, value):
    assert isinstance(value, Positive)
    return value.n * 2


def test_input_schema_refuses_bad_input_and_hands_the_body_the_parsed_value(durable_env):
    with pytest.raises(durable.InvalidInput, match="n must be a positive int"):
        durable.start(schema_flow, {"n": -1})
    run = durable.start(schema_flow, {"n": 4})
    durable_env.run_until_idle()
    assert durable.result(run.id) == 8
    assert durable.get_run(run.id).input == {"n": 4}


def test_stored_input_that_no_longer_fits_the_schema_fails_without_retry(durable_env):
    run = durable.start(schema_flow, {"n": 4})
    Run.objects.filter(id=run.id).update(input={"n": "four"})
    durable_env.run_until_idle()
    record = durable.get_run(run.id)
    assert (record.status, record.error["code"]) == ("failed", "invalid_input")


@durable.workflow(name="tests.recovery_multi")
def multi_flow(ctx, n):
    values = [ctx.step(noop, n), ctx.step(noop, n + 1)]
    ctx.sleep("10s")
    return values + [ctx.wait_for_signal("go", timeout="1h")]


def test_every_run_completes_after_the_broker_loses_everything(durable_env):
    runs = [durable.start(multi_flow, i) for i in range(6)]
    for _ in range(4):  # some runs part-way, some not started
        durable_env.run_next()
    durable_env.drop()  # the broker is flushed: every queued message is gone
    for run in runs[:3]:
        durable.signal(run.id, "go", "early")
    durable_env.drop()
    durable_env.advance_time("5m")
    for run in runs[3:]:
        durable.signal(run.id, "go", "late")
    durable_env.drop()
    durable_env.advance_time("5m")
    assert [durable.result(r.id) for r in runs] == [
        [i, i + 1, "early" if i < 3 else "late"] for i in range(6)
    ]
    steps = Checkpoint.objects.filter(kind="step")
    assert steps.count() == 12 and not steps.exclude(status="completed").exists()


def test_dead_letter_handler_can_take_the_typed_input(durable_env):
    seen = []

    @durable.workflow(name="tests.recovery_typed_dlq", input_schema=durable.DeadLetter)
    def typed(ctx, letter):
        seen.append(letter)
        return letter.dead_run_id

    run = durable.start(typed, {"dead_run_id": "x", "workflow": "w", "input": None, "error": None})
    durable_env.run_until_idle()
    assert durable.result(run.id) == "x"
    assert isinstance(seen[0], durable.DeadLetter)
