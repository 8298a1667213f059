"""``durable.publish_event`` and ``ctx.wait_for_event``: buffered, matched, each at most once per run."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable import clock, dispatch
from durable.engine import events, retention, turn
from durable.models import Event, Run

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.events_paid")
def paid(ctx, order_id):
    return ctx.wait_for_event("order.paid", match={"order": order_id})


@durable.workflow(name="tests.events_two")
def two(ctx, _):
    return [ctx.wait_for_event("tick"), ctx.wait_for_event("tick")]


@durable.workflow(name="tests.events_timeout")
def with_timeout(ctx, _):
    try:
        return ctx.wait_for_event("never", timeout="1h")
    except durable.WaitTimeout as exc:
        return f"gave up: {exc}"


@durable.workflow(name="tests.events_bad_match")
def bad_match(ctx, _):
    return ctx.wait_for_event("x", match={"nested": {"a": 1}})


def test_an_event_published_after_the_wait_wakes_the_run(durable_env):
    run = durable.start(paid, 7)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    durable.publish_event("order.paid", {"order": 7, "cents": 500})
    assert [m.task for m in durable_env.pending()] == [dispatch.ADVANCE]
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"order": 7, "cents": 500}


def test_an_event_published_before_the_wait_is_kept_for_it(durable_env):
    durable.publish_event("order.paid", {"order": 7, "cents": 500})
    run = durable.start(paid, 7)
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"order": 7, "cents": 500}


def test_only_a_matching_event_is_received_and_only_matching_waiters_are_woken(durable_env):
    mine, other = durable.start(paid, 7), durable.start(paid, 8)
    durable_env.run_until_idle()
    durable.publish_event("order.paid", {"order": 8, "cents": 1})
    durable.publish_event("order.paid", "not even a dict")
    assert [m.args for m in durable_env.pending()] == [(other.id,)]
    durable_env.run_until_idle()
    assert durable.get_run(mine.id).status == "suspended"
    assert durable.result(other.id) == {"order": 8, "cents": 1}


def test_every_waiting_run_receives_the_same_event(durable_env):
    runs = [durable.start(paid, 7) for _ in range(3)]
    durable_env.run_until_idle()
    durable.publish_event("order.paid", {"order": 7})
    durable_env.run_until_idle()
    assert [durable.result(r.id) for r in runs] == [{"order": 7}] * 3


def test_an_event_wakes_waiters_read_over_several_batches(durable_env, monkeypatch):
    monkeypatch.setattr(events, "WAITS_PER_READ", 2)
    runs = [durable.start(paid, 7 if i != 3 else 8) for i in range(5)]
    durable_env.run_until_idle()
    durable.publish_event("order.paid", {"order": 7})
    woken = sorted(m.args[0] for m in durable_env.pending())
    assert woken == sorted(r.id for i, r in enumerate(runs) if i != 3)


def test_each_event_reaches_a_run_at_most_once_oldest_first(durable_env):
    durable.publish_event("tick", 1)
    run = durable.start(two)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"  # the second wait does not get tick 1 again
    durable.publish_event("tick", 2)
    durable.publish_event("tick", 3)
    durable_env.run_until_idle()
    assert durable.result(run.id) == [1, 2]


def test_events_older_than_the_buffer_ttl_are_not_received_and_are_pruned(durable_env):
    durable.publish_event("order.paid", {"order": 7})
    durable_env.advance_time("8d")  # EVENT_BUFFER_TTL is 7 days; the retention sweep runs too
    assert not Event.objects.exists()
    Event.objects.create(name="order.paid", payload={"order": 7}, created_at=clock.now() - timedelta(days=8))
    run = durable.start(paid, 7)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    assert retention.prune_events(clock.now() - timedelta(days=7)) == 1


def test_a_wait_times_out_with_wait_timeout(durable_env):
    run = durable.start(with_timeout)
    durable_env.run_until_idle()
    durable_env.advance_time("61m")
    assert durable.result(run.id).startswith("gave up: no event 'never'")


def test_an_event_published_while_the_turn_looked_is_not_missed(durable_env, monkeypatch):
    """The crossing race: the turn looks before the publish commits, the publish looks for
    waiters before the turn's wait commits. The turn's look after its commit catches it."""
    looked = []

    def look_then_publish(*args):
        found = find(*args)
        if not looked:
            looked.append(found)
            # The publish lands now: its row is written, and its look for waiters, made before
            # this turn's wait is written, finds none.
            Event.objects.create(name="order.paid", payload={"order": 7}, created_at=clock.now())
            assert events.wake_waiters("order.paid", {"order": 7}) == 0
        return found

    find = events.find
    monkeypatch.setattr(events, "find", look_then_publish)
    run = durable.start(paid, 7)
    durable_env.drop()
    assert turn.advance(run.id) == "suspended"
    assert looked == [None]
    assert [m.args for m in durable_env.pending()] == [(run.id,)]  # woken by its own second look
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"order": 7}


def test_a_match_must_be_flat_json_scalars(durable_env):
    run = durable.start(bad_match)
    durable_env.run_until_idle()
    error = durable.get_run(run.id).error
    assert error["type"] == "InvalidInput" and "match must be a dict" in error["message"]


@pytest.mark.parametrize(
    ("name", "payload", "says"), [("", 1, "non-empty name"), ("x", {"ids": object()}, "JSON")]
)
def test_publish_refuses_bad_input_before_storing(durable_env, name, payload, says):
    with pytest.raises(durable.InvalidInput, match=says):
        durable.publish_event(name, payload)
    assert not Event.objects.exists()


def test_a_key_named_like_a_lookup_is_still_a_key(durable_env):
    durable.publish_event("odd", {"in": 1, "contains": "x"})
    assert Event.objects.oldest_match("odd", {"in": 1, "contains": "x"}, clock.now() - timedelta(1), set())
    assert Event.objects.oldest_match("odd", {"in": 2}, clock.now() - timedelta(1), set()) is None
    assert not Run.objects.exists()
