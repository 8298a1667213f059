"""Entity prompts: the ops of a key committed while its prompt waits share that prompt (one
message per batch, not per op), yet no op is ever left without an applier coming; and ops carry
their namespace, whose queue they are applied on and whose sweep repairs them."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

import durable
from durable import dispatch
from durable.engine import entity_ops
from durable.models import EntityOp, EntityOpQuerySet, EntityPrompt, OpStatus, entities
from durable.models.base import insertion
from durable.models.entities import EntityPromptQuerySet, Prompt

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


def commits_now(n):
    """Send op ``add(n)`` to key a as another connection would: its commit, and so its prompt's
    claim, happen now, while the applier under test is still at work."""
    durable.signal_entity("tests.prompted", "a", "add", n)
    _, after_commit, _ = connection.run_on_commit.pop()
    after_commit()


def test_an_op_committed_while_the_applier_works_is_applied_by_it(durable_env, monkeypatch):
    """The applier keeps the key's prompt until it finds nothing waiting: an op committed while
    it applies (here: between its read and its commit) finds the prompt, sends no message, and
    is applied by the same applier."""
    read = EntityOpQuerySet.next_pending

    def read_then_a_sender_commits(self, name, key, limit):
        batch = read(self, name, key, limit)
        if len(batch) == 1 and batch[0].arg == 1:
            commits_now(100)
        return batch

    durable.signal_entity("tests.prompted", "a", "add", 1)
    monkeypatch.setattr(EntityOpQuerySet, "next_pending", read_then_a_sender_commits)
    durable_env.run_next()
    assert state("a")["seen"] == [1, 100]
    assert prompts(durable_env) == []
    assert not EntityPrompt.objects.exists()


def test_an_op_committed_as_the_applier_takes_the_prompt_is_never_left_waiting(durable_env, monkeypatch):
    """Its last read found nothing: an op committed before its take found the prompt and sent
    nothing, so the applier reads again after the take; one committed after it sends its own."""
    take = EntityPromptQuerySet.take
    takes = []

    def senders_commit_around_the_take(self, name, key):
        takes.append(key)
        if len(takes) == 1:
            commits_now(100)
        take(self, name, key)
        if len(takes) == 1:
            commits_now(200)

    durable.signal_entity("tests.prompted", "a", "add", 1)
    monkeypatch.setattr(EntityPromptQuerySet, "take", senders_commit_around_the_take)
    durable_env.run_next()
    assert state("a")["seen"] == [1, 100, 200]
    assert prompts(durable_env) == [("tests.prompted", "a")]  # 200's own, sent after the take
    durable_env.run_until_idle()
    assert state("a")["seen"] == [1, 100, 200]
    assert not EntityPrompt.objects.exists()


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


postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a send outside a transaction locks the prompt on PostgreSQL"
)


def an_op(n):
    return EntityOp(
        entity="tests.prompted", key="a", op="add", op_id=f"op-{n}", arg=n, created_at=timezone.now()
    )


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_send_outside_a_transaction_that_finds_the_prompt_needs_none_of_its_own():
    ops, now = EntityOp.objects.all(), timezone.now()
    # No prompt on its way: the statement notes one, committed with the op; the caller sends it.
    assert ops.send(an_op(1), now) is Prompt.CLAIMED
    assert list(EntityPrompt.objects.values_list("key", "sent_at")) == [("a", now)]
    assert ops.send(an_op(2), now) is Prompt.FOUND
    EntityPrompt.objects.all().delete()
    with transaction.atomic():
        assert ops.send(an_op(3), now) is Prompt.NOTHING  # in a transaction: looked for after the commit
    assert not EntityPrompt.objects.exists()
    assert EntityOp.objects.count() == 3


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_prompt_another_sender_inserts_while_the_send_runs_is_claimed_after_the_commit():
    """The statement's read found no prompt and its insert then met one another sender had not
    yet committed: that prompt holds no lock for this op (its applier may take it before this op
    commits), so the caller claims after the commit, as inside a transaction."""
    inserted, release, sent = threading.Event(), threading.Event(), []

    def other_sender():
        try:
            with transaction.atomic():
                EntityPrompt.objects.create(name="tests.prompted", key="a", sent_at=timezone.now())
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    def sender():
        try:
            sent.append(EntityOp.objects.send(an_op(1), timezone.now()))
        finally:
            connection.close()

    # The send's insert waits on the other's uncommitted prompt.
    _second_waits_for_first(other_sender, inserted, sender, release, lambda: not sent)
    assert sent == [Prompt.NOTHING]
    assert EntityOp.objects.count() == EntityPrompt.objects.count() == 1


def _second_waits_for_first(first, ready, second, release, nothing_yet):
    """Run ``first`` in a thread until it sets ``ready`` (holding its lock), then ``second`` in
    another until PostgreSQL shows a statement waiting on a lock; check ``nothing_yet()`` there,
    then ``release`` the first and join both."""
    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert ready.wait(10)
    threads.append(threading.Thread(target=second))
    threads[1].start()
    deadline = time.monotonic() + 10
    while not _a_statement_waits_on_a_lock():
        assert time.monotonic() < deadline, "no statement waited on a lock"
        time.sleep(0.01)
    assert nothing_yet()
    release.set()
    for thread in threads:
        thread.join(10)


def _a_statement_waits_on_a_lock():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone() is not None


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_the_take_waits_for_a_send_that_found_the_prompt_so_the_read_after_it_sees_the_op():
    """A send that found the prompt sends no message: the applier's take must not pass it until
    its op is committed, or the applier's last read would miss the op and nobody would apply it."""
    EntityPrompt.objects.create(name="tests.prompted", key="a", sent_at=timezone.now())
    found, release, seen = threading.Event(), threading.Event(), []

    def sender():
        # The send statement, held open between its lock and its commit.
        sql, params = insertion(EntityOp, "default", [an_op(1)])
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                key = ["tests.prompted", "a"]
                cursor.execute(
                    entities._statement("default", "send").format(insert=sql),
                    [*params, *key, *key, timezone.now()],
                )
                assert cursor.fetchone() == (True, False)  # found, not claimed
                found.set()
                release.wait(10)
        finally:
            connection.close()

    def applier():
        try:
            EntityPrompt.objects.take("tests.prompted", "a")
            seen.append(EntityOp.objects.waiting("tests.prompted", "a"))
        finally:
            connection.close()

    # The take waits for the sender's commit.
    _second_waits_for_first(sender, found, applier, release, lambda: not seen)
    assert seen == [True]
    assert not EntityPrompt.objects.exists()
