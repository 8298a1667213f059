"""Entity prompts: the ops of a key committed while its prompt waits share that prompt (one
message per batch, not per op), yet no op is ever left without an applier coming; and ops carry
their namespace, whose queue they are applied on and whose sweep repairs them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings

import durable
from durable import dispatch
from durable.engine import entity_ops
from durable.models import EntityOp, EntityOpQuerySet, EntityPrompt, OpStatus

pytestmark = pytest.mark.django_db


@durable.entity("tests.prompted")
class Counter:
    def initial_state(self):
        return {"n": 0, "seen": []}

    def add(self, state, arg):
        state["n"] += arg
        state["seen"].append(arg)
        return state["n"]


@durable.workflow(name="tests.prompted_sender")
def sender(ctx, key):
    ctx.signal_entity("tests.prompted", key, "add", 1)
    return "sent"


def prompts(durable_env):
    return [m.args for m in durable_env.pending() if m.task == dispatch.APPLY_ENTITY]


def state(key):
    return durable.entity_state("tests.prompted", key)


def test_ops_committed_while_a_prompt_waits_share_it(durable_env):
    for n in (1, 2, 3):
        durable.signal_entity("tests.prompted", "a", "add", n)
    with transaction.atomic():
        durable.signal_entity("tests.prompted", "a", "add", 4)
        durable.signal_entity("tests.prompted", "b", "add", 10)
    assert prompts(durable_env) == [("tests.prompted", "a"), ("tests.prompted", "b")]
    durable_env.run_until_idle()
    assert state("a") == {"n": 10, "seen": [1, 2, 3, 4]}
    assert state("b")["n"] == 10
    assert not EntityPrompt.objects.exists()
    # The applier took the prompt: the key's next op sends one of its own.
    durable.signal_entity("tests.prompted", "a", "add", 5)
    assert prompts(durable_env) == [("tests.prompted", "a")]
    durable_env.run_until_idle()
    assert state("a")["seen"] == [1, 2, 3, 4, 5]


def test_an_op_committed_after_the_applier_took_the_prompt_sends_its_own(durable_env, monkeypatch):
    """The applier takes the prompt before it reads the pending ops: an op committed while it
    applies (here: between its read and its commit) cannot be left waiting for it."""
    read = EntityOpQuerySet.next_pending
    late = []

    def read_then_a_sender_commits(self, name, key, limit):
        batch = read(self, name, key, limit)
        if not late:
            late.append(durable.signal_entity("tests.prompted", "a", "add", 100))
            # That sender is another connection in production: its commit, and so its prompt's
            # claim, happen now, while this applier is still at work.
            _, after_commit, _ = connection.run_on_commit.pop()
            after_commit()
        return batch

    durable.signal_entity("tests.prompted", "a", "add", 1)
    monkeypatch.setattr(EntityOpQuerySet, "next_pending", read_then_a_sender_commits)
    durable_env.run_next()
    assert state("a")["seen"] == [1]
    assert prompts(durable_env) == [("tests.prompted", "a")]  # the late op's own prompt
    durable_env.run_until_idle()
    assert state("a")["seen"] == [1, 100]


def test_ops_coalesced_into_a_lost_prompt_are_applied_by_the_sweep(durable_env):
    durable.signal_entity("tests.prompted", "a", "add", 1)
    assert len(durable_env.drop()) == 1  # the broker lost it
    durable.signal_entity("tests.prompted", "a", "add", 2)
    assert prompts(durable_env) == []  # the lost prompt looks on its way
    durable_env.advance_time("10s")
    assert state("a")["seen"] == [1, 2]
    assert not EntityPrompt.objects.exists()  # the sweep forgot the lost prompt
    durable.signal_entity("tests.prompted", "a", "add", 3)
    assert prompts(durable_env) == [("tests.prompted", "a")]


def test_a_stale_prompt_is_forgotten_even_when_its_ops_were_applied(durable_env):
    durable.signal_entity("tests.prompted", "a", "add", 1)
    durable_env.drop()
    entity_ops.apply("tests.prompted", "b")  # another key's applier leaves it alone
    assert EntityPrompt.objects.filter(key="a").exists()
    durable_env.advance_time("10s")
    assert not EntityPrompt.objects.exists()


def test_a_prompt_that_could_not_be_sent_is_not_waited_for(durable_env):
    with durable_env.broker_down():
        durable.signal_entity("tests.prompted", "a", "add", 1)
    assert not EntityPrompt.objects.exists()
    durable.signal_entity("tests.prompted", "a", "add", 2)
    assert prompts(durable_env) == [("tests.prompted", "a")]
    durable_env.run_until_idle()
    assert state("a")["seen"] == [1, 2]


def test_ops_go_to_their_namespace_queue_and_only_its_sweep_repairs_them(durable_env):
    durable.start(sender, "b", namespace="tenant-b")
    assert [m.queue for m in durable_env.pending()] == ["durable.tenant-b"]
    durable_env.run_until_idle()
    assert state("b")["n"] == 1  # the workflow's op: its prompt went to tenant-b's queue
    with override_settings(DURABLE={"NAMESPACE": "tenant-a"}):
        durable.signal_entity("tests.prompted", "a", "add", 1)
    durable.signal_entity("tests.prompted", "c", "add", 1)  # no namespace
    queued = [(m.args[1], m.queue) for m in durable_env.pending()]
    assert queued == [("a", "durable.tenant-a"), ("c", "durable")]
    assert dict(EntityOp.objects.values_list("key", "namespace")) == {
        "a": "tenant-a",
        "b": "tenant-b",
        "c": "",
    }

    durable_env.drop()  # a and c lose their prompts
    EntityOp.objects.update(created_at=durable_env.now() - timedelta(minutes=1))
    with override_settings(DURABLE={"NAMESPACE": "tenant-b"}):
        assert entity_ops.sweep_entities() == 0  # tenant-b's beat: none of these ops is its
    with override_settings(DURABLE={"NAMESPACE": "tenant-a"}):
        assert entity_ops.sweep_entities() == 1
    assert [(m.args[1], m.queue) for m in durable_env.pending()] == [("a", "durable.tenant-a")]
    assert entity_ops.sweep_entities() == 2  # a beat without a namespace sweeps them all
    queued = [(m.args[1], m.queue) for m in durable_env.pending()]
    assert queued == [("a", "durable.tenant-a"), ("a", "durable.tenant-a"), ("c", "durable")]
    durable_env.run_until_idle()
    assert not EntityOp.objects.filter(status=OpStatus.PENDING).exists()
