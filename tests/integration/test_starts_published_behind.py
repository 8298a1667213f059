"""In a process that serves no queue, a run's first turn is published by the process's publishing
thread, with the Celery app the caller had: at once outside a transaction, after the commit
inside one. A worker publishes in place, as before."""

from __future__ import annotations

import threading

import pytest
from celery import Celery, current_app
from django.db import transaction
from django.test import override_settings

import durable
from durable import dispatch, publish_behind

pytestmark = pytest.mark.django_db(transaction=True)


@durable.workflow(name="tests.behind_noop")
def noop(ctx):
    return None


class Sent:
    def __init__(self) -> None:
        self.messages: list[dispatch.Message] = []
        self.threads: set[str] = set()

    def __call__(self, message: dispatch.Message) -> None:
        self.messages.append(message)
        self.threads.add(threading.current_thread().name)

    @property
    def woken(self) -> list[str]:
        return [run_id for message in self.messages for run_id in dispatch.woken(message)]


def test_starts_outside_a_transaction_leave_from_the_publishing_thread_each_once():
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent, behind=True)):
        ids = [noop.start().id for _ in range(20)]
        assert dispatch.flush(10)
    assert sorted(sent.woken) == sorted(ids)
    assert sent.threads == {"durable-publisher"}


def test_a_loop_of_starts_leaves_in_batches_of_at_most_eight(monkeypatch):
    monkeypatch.setattr(publish_behind, "BURST_GAP", 60.0)  # a burst however slow the machine
    # Held until eight are in, however slow the machine (flush sends what is left).
    monkeypatch.setattr(publish_behind, "LINGER", 60.0)
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent, behind=True)):
        ids = [noop.start().id for _ in range(16)]
        assert dispatch.flush(10)
    assert sorted(sent.woken) == sorted(ids)
    assert dispatch.ADVANCE_BATCH in {message.task for message in sent.messages}
    assert max(len(dispatch.woken(message)) for message in sent.messages) == publish_behind.BATCH
    # Two lots of eight; or, when the thread woke to nine or more, the lot past eight beside them.
    assert len(sent.messages) <= 3


def test_starts_in_a_transaction_leave_from_the_thread_after_its_commit():
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent, behind=True)):
        with transaction.atomic():
            ids = [noop.start().id for _ in range(3)]
            assert dispatch.flush(10)
            assert sent.messages == []
        assert dispatch.flush(10)
    assert sorted(sent.woken) == sorted(ids)
    assert sent.threads == {"durable-publisher"}


def test_starts_in_a_rolled_back_savepoint_send_nothing():
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent, behind=True)):
        with transaction.atomic():
            kept = noop.start().id
            with pytest.raises(RuntimeError), transaction.atomic():
                noop.start()
                raise RuntimeError("the inner block failed")
        assert dispatch.flush(10)
    assert sent.woken == [kept]


def test_a_worker_publishes_a_transactions_first_turns_at_its_commit_itself():
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent)):
        with transaction.atomic():
            ids = [noop.start().id for _ in range(3)]
            assert sent.messages == []
        assert sorted(sent.woken) == sorted(ids)
    assert sent.threads == {threading.current_thread().name}


def test_a_transport_that_publishes_in_place_sends_before_start_returns():
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent)):
        run_id = noop.start().id
        assert sent.woken == [run_id]
    assert sent.threads == {threading.current_thread().name}


@override_settings(DURABLE={"PUBLISH_IN_THREAD": False})
def test_publishing_in_the_thread_turned_off_sends_before_start_returns():
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent, behind=True)):
        run_id = noop.start().id
        assert sent.woken == [run_id]
    assert sent.threads == {threading.current_thread().name}


def test_publish_in_thread_must_be_a_bool():
    from durable import conf

    assert conf.problems({"PUBLISH_IN_THREAD": "yes"}) == [
        ("PUBLISH_IN_THREAD", "must be True or False, got 'yes'")
    ]
    assert conf.problems({"PUBLISH_IN_THREAD": False}) == []


def test_the_publishing_thread_uses_the_callers_celery_app():
    app = Celery("tests-behind", set_as_current=False)
    seen: list[str] = []

    def publish(lot: list[publish_behind.Wake]) -> None:
        seen.append(current_app.main)

    previous = current_app._get_current_object()
    app.set_current()
    try:
        publisher = publish_behind.Publisher(publish, dispatch._carry_app)
        publisher.put("q", "r1")
        assert publisher.flush(10)
    finally:
        previous.set_current()
    assert seen == ["tests-behind"]


def test_waiting_for_a_result_hurries_a_lingering_first_turn(monkeypatch):
    monkeypatch.setattr(publish_behind, "BURST_GAP", 60.0)
    monkeypatch.setattr(publish_behind, "LINGER", 60.0)
    sent = Sent()
    with dispatch.using(dispatch.Transport(send=sent, behind=True)):
        run_id = noop.start().id
        with pytest.raises(durable.WaitTimeout):
            durable.result(run_id, timeout=0.5)
        assert sent.woken == [run_id]  # left when the wait began, not LINGER later
