"""Singleton workflows: at most ``limit`` runs per key in flight, the rest wait in start order."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

import durable
from durable import dispatch
from durable.definitions import Singleton
from durable.engine import singletons, sweeps, turn
from durable.models import Run

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.single_sync", singleton=Singleton(key="{customer}"))
def sync(ctx, job):
    return ctx.wait_for_signal("done")


@durable.workflow(
    name="tests.single_pair", singleton=Singleton(key=lambda job: job["customer"], limit=2, max_queue_depth=1)
)
def pair(ctx, job):
    return ctx.wait_for_signal("done")


@durable.workflow(name="tests.single_parent")
def parent(ctx, customers):
    return [ctx.child(sync, {"customer": c}) for c in customers]


def _status(handle):
    run = durable.get_run(handle.id)
    return run.status, run.admitted


def _finish(durable_env, handle):
    durable.signal(handle.id, "done", handle.id)
    durable_env.run_until_idle()


def test_one_run_per_key_in_flight_the_rest_wait_in_start_order(durable_env):
    first, second, third = (durable.start(sync, {"customer": "acme", "n": n}) for n in range(3))
    other = durable.start(sync, {"customer": "globex"})
    # Only the runs that hold a slot get a turn.
    assert {m.args[0] for m in durable_env.pending()} == {first.id, other.id}
    durable.signal(second.id, "done", second.id)  # kept while it waits; its turn is refused
    durable_env.run_until_idle()
    assert [_status(h) for h in (first, second, third, other)] == [
        ("suspended", True),
        ("pending", False),
        ("pending", False),
        ("suspended", True),
    ]
    assert turn.advance(second.id) == "busy"  # a waiting run cannot be claimed
    durable_env.advance_time("1h")  # nor woken by a sweep
    assert _status(second) == ("pending", False)
    _finish(durable_env, first)
    assert durable.get_run(second.id).status == "completed"  # admitted at once, its signal was there
    assert _status(third) == ("suspended", True)
    _finish(durable_env, third)
    assert [durable.result(h.id) for h in (first, second, third)] == [first.id, second.id, third.id]


def test_limit_and_max_queue_depth(durable_env):
    runs = [durable.start(pair, {"customer": "acme", "n": n}) for n in range(3)]
    with pytest.raises(durable.QueueFull, match="limit 2 \\+ max_queue_depth 1") as caught:
        durable.start(pair, {"customer": "acme", "n": 3})
    assert caught.value.code == "queue_full"
    assert Run.objects.filter(workflow="tests.single_pair").count() == 3  # nothing stored
    durable_env.run_until_idle()
    assert [_status(h)[1] for h in runs] == [True, True, False]


def test_a_cancel_or_a_delete_hands_the_slot_on(durable_env):
    first, second, third = (durable.start(sync, {"customer": "acme"}) for _ in range(3))
    durable_env.run_until_idle()
    assert durable.cancel(first.id) is True
    durable_env.run_until_idle()
    assert _status(second) == ("suspended", True)
    durable.delete_run(second.id)
    durable_env.run_until_idle()
    assert _status(third) == ("suspended", True)


def test_a_retried_run_goes_to_the_back_of_the_line(durable_env):
    first, second = durable.start(sync, {"customer": "acme"}), durable.start(sync, {"customer": "acme"})
    durable_env.run_until_idle()
    durable.cancel(first.id)
    durable_env.run_until_idle()
    durable.retry(first.id)
    assert _status(first) == ("pending", False)
    _finish(durable_env, second)
    assert _status(first) == ("suspended", True)


def test_children_of_a_singleton_workflow_wait_in_its_line(durable_env):
    run = durable.start(parent, ["acme", "acme"])
    durable_env.run_until_idle()
    (kid,) = Run.objects.filter(parent_id=run.id).values_list("id", flat=True)
    durable.signal(kid, "done", 1)
    durable_env.run_until_idle()
    kids = list(
        Run.objects.filter(parent_id=run.id).order_by("singleton_seq").values_list("status", flat=True)
    )
    assert kids == ["completed", "suspended"]


def test_a_lost_admission_message_is_re_driven_and_a_raised_limit_admits_more(durable_env, monkeypatch):
    first, second = durable.start(sync, {"customer": "acme"}), durable.start(sync, {"customer": "acme"})
    durable_env.run_until_idle()
    durable.signal(first.id, "done", 1)
    durable_env.run_next()  # the turn completes the run and admits the next ...
    assert durable_env.drop() == [
        dispatch.Message(dispatch.ADVANCE, (second.id,), "durable")
    ]  # ... whose message is lost
    durable_env.advance_time("5m")  # RECONCILE_INTERVAL: the timer sweep re-drives it
    assert _status(second) == ("suspended", True)
    waiting = [durable.start(sync, {"customer": "acme"}) for _ in range(2)]
    monkeypatch.setattr(sync, "singleton", Singleton(key="{customer}", limit=3))  # a deploy raised it
    assert sweeps.sweep_timers() >= 2
    assert all(durable.get_run(h.id).admitted for h in waiting)


@pytest.mark.parametrize(
    ("option", "says"),
    [(Singleton, "is a callable of the input"), ("acme", "singleton= takes a durable")],
)
def test_bad_singleton_definitions_are_refused(option, says):
    with pytest.raises(durable.InvalidInput, match=says):
        value = option(key="") if option is Singleton else option
        durable.workflow(lambda ctx, _: None, name="tests.single_bad", singleton=value)


def test_an_input_that_gives_no_key_is_refused_before_storing(durable_env):
    with pytest.raises(durable.InvalidInput, match="could not be made from the input"):
        durable.start(sync, {"client": "acme"})
    assert not Run.objects.exists()


def test_concurrent_starts_take_one_slot(postgres, transactional_db, durable_env):
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def start():
        try:
            barrier.wait(5)
            with transaction.atomic():
                durable.start(sync, {"customer": "race"})
                time.sleep(0.05)  # hold the slot row while the others queue on it
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    admitted = list(Run.objects.filter(workflow="tests.single_sync").values_list("admitted", flat=True))
    assert sorted(admitted) == [False, False, False, True]
    assert singletons.admit("tests.single_sync:race", "tests.single_sync") == []
