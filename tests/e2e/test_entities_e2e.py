"""End to end: entity ops from 20 concurrent senders over 10 keys, applied by real workers that
are SIGKILLed twice while the broker's Redis database is flushed once; and 100 workflows that
call one key at once.

Every balance must end exactly the sum sent to its key and every op id must be applied once: the
state keeps a ledger of the op ids applied to it, in the order they were applied. The workers
import this module (``--include``), so the entity and workflow below are registered on both sides.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict

import pytest
from django.db import connections
from django.test import override_settings

import durable
from durable.models import TERMINAL, EntityOp, Run
from durable.testing import flush_broker, settings_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SENDERS, KEYS, OPS = 20, 10, 10_000
CALLERS = 100
#: The chaos, each when this share of the ops is sent: it lands in the middle of the traffic
#: however fast the machine sends.
CHAOS = [(0.2, "kill", 0), (0.45, "flush", None), (0.7, "kill", 1)]
SETTINGS = {
    "LEASE": "3s",
    "RECONCILE_INTERVAL": "5s",
    "ENTITY_SWEEP_INTERVAL": "1s",
    "ORPHAN_SWEEP_INTERVAL": "1s",
    # Every op row is kept, so the ledger of op rows can be checked against what was sent.
    "ENTITY_OPS_KEPT": 2 * OPS // KEYS,
}


@durable.entity("tests.e2e_account")
class LedgerAccount:
    def initial_state(self):
        return {"balance": 0, "ops": []}

    def deposit(self, state, arg):
        state["balance"] += arg["amount"]
        state["ops"].append(arg["id"])
        return state["balance"]


@durable.workflow(name="tests.e2e_entity_caller")
def caller(ctx, arg):
    return ctx.call_entity("tests.e2e_account", arg["key"], "deposit", {"amount": arg["n"], "id": ctx.run_id})


@pytest.fixture
def durable_worker_options():
    env = settings_env(SETTINGS)
    return {"start": False, "env": env}


def send_all(token: str, sender: int, sent: dict, lock: threading.Lock, errors: list) -> None:
    """One sender: its share of the ops, some sent twice with the same op id (a retried call)."""
    rng = random.Random(sender)
    try:
        for i in range(OPS // SENDERS):
            key, amount, op_id = f"{token}-k{(sender + i) % KEYS}", rng.randint(1, 100), f"s{sender}-{i}"
            for _ in range(2 if i % 10 == 0 else 1):
                durable.signal_entity(
                    "tests.e2e_account", key, "deposit", {"amount": amount, "id": op_id}, op_id=op_id
                )
            with lock:
                sent[key].append((op_id, amount))
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
    finally:
        connections.close_all()


def test_entity_ops_apply_exactly_once_through_kills_and_a_broker_flush(
    postgres, redis_broker, durable_worker
):
    began = time.monotonic()
    token = f"e2e-{uuid.uuid4().hex[:8]}"
    with override_settings(DURABLE=SETTINGS):
        workers = [
            durable_worker.add_worker({"DURABLE_INSTANCE_ID": f"ent-w{i}"}, name=f"w{i}", wait=False)
            for i in (1, 2)
        ]
        for worker in workers:
            worker.wait_ready()
        durable_worker.start_beat()

        hot = f"{token}-hot"
        runs = [
            durable.start(caller, {"key": hot, "n": n}, run_id=f"{hot}-{n}") for n in range(1, CALLERS + 1)
        ]
        sent: dict[str, list[tuple[str, int]]] = defaultdict(list)
        lock, errors = threading.Lock(), []
        senders = [
            threading.Thread(target=send_all, args=(token, s, sent, lock, errors)) for s in range(SENDERS)
        ]
        for thread in senders:
            thread.start()
        chaos_began = time.monotonic()
        for share, what, victim in CHAOS:
            while any(thread.is_alive() for thread in senders):
                with lock:
                    if sum(map(len, sent.values())) >= share * OPS:
                        break
                time.sleep(0.05)
            if what == "flush":
                flushed = flush_broker(durable_worker.queues)
            else:
                workers[victim].kill()
                workers[victim].restart()
        for thread in senders:
            thread.join()
        assert not errors, errors
        sent_for = time.monotonic() - chaos_began
        keys = [*sent, hot]

        def settled() -> bool:
            pending = EntityOp.objects.filter(entity="tests.e2e_account", key__in=keys, status="pending")
            return (
                not pending.exists()
                and not Run.objects.filter(id__in=[r.id for r in runs]).exclude(status__in=TERMINAL).exists()
            )

        wait_for(settled, 90, interval=0.5, what="every op applied and every caller finished")

    applied = EntityOp.objects.filter(entity="tests.e2e_account", key__in=list(sent))
    assert applied.count() == OPS // SENDERS * SENDERS
    assert not applied.exclude(status="applied").exists()
    for key, ops in sent.items():
        state = durable.entity_state("tests.e2e_account", key)
        assert state["balance"] == sum(amount for _, amount in ops), key
        assert sorted(state["ops"]) == sorted(op_id for op_id, _ in ops), key  # each op id once
        # One sender's ops reach a key in the order it sent them.
        for sender in range(SENDERS):
            mine = [int(op.split("-")[1]) for op in state["ops"] if op.startswith(f"s{sender}-")]
            assert mine == sorted(mine), (key, sender)

    results = [durable.result(r.id) for r in runs]
    hot_state = durable.entity_state("tests.e2e_account", hot)
    assert hot_state["balance"] == sum(range(1, CALLERS + 1))
    assert sorted(hot_state["ops"]) == sorted(r.id for r in runs)
    assert len(set(results)) == CALLERS  # each caller got its own running balance
    by_run = dict(zip([r.id for r in runs], results, strict=True))
    running, expected = 0, {}
    for run_id in hot_state["ops"]:
        running += int(run_id.rsplit("-", 1)[1])
        expected[run_id] = running
    assert by_run == expected
    print(
        f"\n{OPS} ops from {SENDERS} senders over {KEYS} keys sent in {sent_for:.1f} s, "
        f"{CALLERS} callers of one key; kills: {sum(w.kills for w in workers)}; broker: {flushed}; "
        f"wall time {time.monotonic() - began:.1f} s"
    )
