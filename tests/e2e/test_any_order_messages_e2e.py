"""``ctx.wait_for_message`` on a real worker: updates and signals of several names sent in one
burst, the worker SIGKILLed while the body handles one of them, every update answered once with
its own reply and the signals taken in the order they were sent."""

from __future__ import annotations

import time

import pytest

import durable
from durable.models import Checkpoint, Signal
from durable.testing import wait_for
from durable.values import decode
from tests.e2e.conftest import settings_fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# A short lease, so the killed worker's turn is known dead in seconds; the same in worker and beat.
SETTINGS = {"LEASE": "3s", "ORPHAN_SWEEP_INTERVAL": "1s"}

durable_worker_options, short_lease = settings_fixtures(SETTINGS)


@durable.step
def weigh(parcel: str) -> int:
    time.sleep(0.4)  # long enough to be killed in
    return len(parcel) * 100


@durable.workflow(name="tests.e2e_any_order_depot")
def depot(ctx, _):
    total, notes = 0, []
    while True:
        message = ctx.wait_for_message(signals=["note", "close"], updates=["load", "unload"])
        if isinstance(message, durable.Signal):
            if message.name == "close":
                return {"total": total, "notes": notes}
            notes.append(message.payload)
            continue
        grams = ctx.step(weigh, message.payload)  # a step between the wait and the reply
        total += grams if message.name == "load" else -grams
        ctx.reply(message, {"total": total})


@depot.validator("load")
def _named(payload):
    if not isinstance(payload, str):
        raise ValueError("a parcel is named by a string")


def test_a_burst_of_updates_and_signals_survives_a_sigkill_each_update_answered_once(durable_worker):
    durable_worker.start_beat()
    run = durable.start(depot, None)
    sent = []
    for i, parcel in enumerate(["box", "crate", "tube", "bag"]):
        sent.append(durable.update(run.id, "load", parcel, idempotency_key=f"load-{i}"))
        durable.signal(run.id, "note", f"note {i}")
    sent.append(durable.update(run.id, "unload", "tube", idempotency_key="unload-0"))
    steps = Checkpoint.objects.filter(run_id=run.id, kind="step")
    wait_for(
        lambda: (
            steps.filter(status="completed").count() >= 1
            and steps.filter(status="pending", started_at__isnull=False).exists()
        ),
        timeout=30,
        what="a step running after the first was recorded",
    )
    durable_worker.kill()
    durable_worker.restart()
    # Each caller retries its update with its key: the first one's reply comes back.
    assert durable.update(run.id, "unload", "tube", idempotency_key="unload-0", wait="60s") == {"total": 1100}
    durable.signal(run.id, "close")
    assert durable.result(run.id, timeout="60s") == {"total": 1100, "notes": [f"note {i}" for i in range(4)]}
    replies = dict(Signal.objects.filter(run_id=run.id, is_update=True).values_list("id", "reply"))
    assert [decode(replies[update_id]) for update_id in sent] == [
        {"total": 300},
        {"total": 800},
        {"total": 1200},
        {"total": 1500},
        {"total": 1100},
    ]
    history = Checkpoint.objects.filter(run_id=run.id)
    assert history.filter(kind="reply").count() == 5
    assert (
        history.filter(kind="step").count() == 5 and not history.filter(kind="step", attempt__gt=2).exists()
    )
    assert sorted(history.filter(kind="reply").values_list("input__update", flat=True)) == sorted(sent)
