"""Signals with an idempotency key, and ``ctx.wait_for_any_signal``, through durable_env."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

import durable
from durable.models import Signal

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.signal_keys_tally")
def tally(ctx, _):
    total = 0
    while True:
        amount = ctx.wait_for_signal("add")
        if amount is None:
            return total
        total += amount


@durable.workflow(name="tests.signal_keys_decide")
def decide(ctx, timeout):
    try:
        name, payload = ctx.wait_for_any_signal(["approve", "reject"], timeout=timeout)
    except durable.WaitTimeout:
        return "no decision"
    return {"decision": name, "by": payload}


def test_the_same_idempotency_key_again_is_dropped(durable_env):
    run = durable.start(tally)
    for _ in range(3):
        durable.signal(run.id, "add", 5, idempotency_key="payment-1")
    durable.signal(run.id, "add", 2, idempotency_key="payment-2")
    durable.signal(run.id, "add", None)
    durable_env.run_until_idle()
    assert durable.result(run.id) == 7
    assert Signal.objects.filter(run_id=run.id).count() == 3


def test_a_key_is_per_run(durable_env):
    first, second = durable.start(tally), durable.start(tally)
    durable.signal(first.id, "add", 1, idempotency_key="k")
    durable.signal(second.id, "add", 1, idempotency_key="k")
    assert Signal.objects.filter(idempotency_key="k").count() == 2


def test_a_repeated_key_is_dropped_even_once_the_run_has_finished(durable_env):
    run = durable.start(tally)
    durable.signal(run.id, "add", None, idempotency_key="stop")
    durable_env.run_until_idle()
    assert durable.result(run.id) == 0
    durable.signal(run.id, "add", None, idempotency_key="stop")  # a retried send: nothing to do
    with pytest.raises(durable.RunFinished):
        durable.signal(run.id, "add", None, idempotency_key="another")


def test_signals_and_updates_share_the_keys_of_a_run(durable_env):
    run = durable.start(tally)
    first = durable.update(run.id, "add", 1, idempotency_key="k")
    durable.signal(run.id, "add", 1, idempotency_key="k")
    assert durable.update(run.id, "add", 1, idempotency_key="k") == first
    assert Signal.objects.count() == 1


def test_a_handle_signals_with_a_key(durable_env):
    run = durable.start(tally)
    run.signal("add", 1, idempotency_key="k")
    run.signal("add", 1, idempotency_key="k")
    assert Signal.objects.count() == 1


@pytest.mark.parametrize("key", ["", 7, "k" * 256, "nul\x00"])
def test_a_bad_idempotency_key_is_refused_before_anything_is_stored(durable_env, key):
    run = durable.start(tally)
    with pytest.raises(durable.InvalidInput, match="idempotency_key"):
        durable.signal(run.id, "add", 1, idempotency_key=key)
    assert not Signal.objects.exists()


def test_concurrent_signals_with_one_key_keep_one(postgres, transactional_db, durable_env):
    run = durable.start(tally)
    first_wrote = threading.Event()
    errors: list[BaseException] = []

    def call(hold):
        try:
            with transaction.atomic():
                durable.signal(run.id, "add", 1, idempotency_key="race")
                first_wrote.set()
                if hold:
                    time.sleep(0.5)  # the second INSERT waits on this uncommitted row, then conflicts
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    first = threading.Thread(target=call, args=(True,))
    first.start()
    first_wrote.wait(10)
    second = threading.Thread(target=call, args=(False,))
    second.start()
    first.join(10)
    second.join(10)
    assert errors == []
    assert Signal.objects.filter(run_id=run.id).count() == 1


def test_wait_for_any_signal_takes_the_oldest_of_its_names(durable_env):
    run = durable.start(decide, None)
    durable.signal(run.id, "comment", "looks fine")
    durable.signal(run.id, "reject", "bob")
    durable.signal(run.id, "approve", "ann")
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"decision": "reject", "by": "bob"}
    assert list(Signal.objects.filter(consumed_seq__isnull=False).values_list("name", flat=True)) == [
        "reject"
    ]


def test_wait_for_any_signal_resumes_on_the_first_that_arrives(durable_env):
    run = durable.start(decide, "1h")
    durable_env.run_until_idle()
    durable.signal(run.id, "approve", "ann")
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"decision": "approve", "by": "ann"}


def test_wait_for_any_signal_times_out(durable_env):
    run = durable.start(decide, "1h")
    durable_env.run_until_idle()
    durable_env.advance_time("1h")
    assert durable.result(run.id) == "no decision"
