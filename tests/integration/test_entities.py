"""Durable entities: ops per key applied once each, in arrival order, under the key's lock; the
sweep repairs lost prompts; workflows send ops once per position and read their results."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

import durable
from durable import dispatch
from durable.engine import entity_ops, turn
from durable.models import Checkpoint, Entity, EntityOp, OpStatus
from tests.transitions import forging

pytestmark = pytest.mark.django_db


@durable.entity("tests.account")
class Account:
    def initial_state(self):
        return {"balance": 0, "log": []}

    def deposit(self, state, amount):
        state["balance"] += amount
        state["log"].append(amount)
        return state["balance"]

    def withdraw(self, state, amount):
        state["log"].append(-amount)  # written before the check: a raising op must leave no trace
        if amount > state["balance"]:
            raise durable.ApplicationError("insufficient funds", code="insufficient_funds")
        state["balance"] -= amount
        return state["balance"]

    def whoami(self, state, _):
        return [self.entity_name, self.entity_key]

    def corrupt(self, state, _):
        state["bad"] = object()

    def bad_result(self, state, _):
        return {1, 2}

    def pair_result(self, state, _):
        return (state["balance"], len(state["log"]))

    def pair_in_state(self, state, _):
        state["last"] = (1, 2)

    def transfer(self, state, arg):
        # An op may send ops to other entities: stored in its transaction, sent after commit.
        state["balance"] -= arg["amount"]
        durable.signal_entity("tests.account", arg["to"], "deposit", arg["amount"])
        return state["balance"]

    def open_case(self, state, arg):
        # An op may start a workflow: the run is written in the op's transaction.
        return durable.start(pay, {"key": arg, "amount": 1}, run_id=f"case-{arg}").id

    def open_case_then_fail(self, state, arg):
        durable.start(pay, {"key": arg, "amount": 1}, run_id=f"case-{arg}")
        raise ValueError("no case after all")

    def transfer_then_fail(self, state, arg):
        durable.signal_entity("tests.account", arg["to"], "deposit", arg["amount"])
        raise ValueError("changed my mind")


@durable.workflow(name="tests.entities_pay")
def pay(ctx, arg):
    ctx.signal_entity("tests.account", arg["key"], "deposit", 10)
    balance = ctx.call_entity("tests.account", arg["key"], "deposit", arg["amount"])
    return {"balance": balance, "after": ctx.call_entity("tests.account", arg["key"], "whoami")}


@durable.workflow(name="tests.entities_overdraw")
def overdraw(ctx, key):
    try:
        ctx.call_entity("tests.account", key, "withdraw", 1_000)
    except durable.StepFailed as exc:
        return {"code": exc.code, "message": exc.message}
    return "withdrew"


@durable.workflow(name="tests.entities_timeout")
def call_with_timeout(ctx, key):
    try:
        return ctx.call_entity("tests.account", key, "deposit", 1, timeout="1m")
    except durable.WaitTimeout as exc:
        return f"timed out: {exc}"


@durable.workflow(name="tests.entities_sends_a_tuple")
def sends_a_tuple(ctx, key):
    ctx.signal_entity("tests.account", key, "deposit", (1, 2))


@durable.workflow(name="tests.entities_unknown_op")
def unknown_op(ctx, _):
    return ctx.call_entity("tests.account", "a", "steal", 1)


def balance(key):
    return durable.entity_state("tests.account", key)["balance"]


def test_ops_sent_from_outside_are_applied_after_commit_in_arrival_order(durable_env):
    for amount in (5, 7, 11):
        durable.signal_entity("tests.account", "a", "deposit", amount)
    assert balance("a") == 0  # stored, not applied yet
    assert {m.task for m in durable_env.pending()} == {dispatch.APPLY_ENTITY}
    durable_env.run_until_idle()
    state = durable.entity_state("tests.account", "a")
    assert state == {"balance": 23, "log": [5, 7, 11]}
    ops = EntityOp.objects.order_by("id")
    assert [(op.status, op.result) for op in ops] == [("applied", 5), ("applied", 12), ("applied", 23)]
    assert Entity.objects.get(name="tests.account", key="a").applied == 3
    assert EntityOp.objects.filter(error__isnull=True, applied_at__isnull=False).count() == 3


def test_an_unknown_key_reads_as_its_initial_state_and_keys_are_independent(durable_env):
    durable.signal_entity("tests.account", "a", "deposit", 5)
    durable_env.run_until_idle()
    assert balance("a") == 5
    assert durable.entity_state("tests.account", "never-touched") == {"balance": 0, "log": []}


def test_the_same_op_id_again_is_applied_once(durable_env):
    for _ in range(3):
        assert durable.signal_entity("tests.account", "a", "deposit", 5, op_id="order-1") == "order-1"
    durable_env.run_until_idle()
    durable.signal_entity("tests.account", "a", "deposit", 5, op_id="order-1")  # after it applied too
    durable_env.run_until_idle()
    assert balance("a") == 5
    assert EntityOp.objects.count() == 1


def test_an_op_id_is_per_key(durable_env):
    durable.signal_entity("tests.account", "a", "deposit", 5, op_id="x")
    durable.signal_entity("tests.account", "b", "deposit", 6, op_id="x")
    durable_env.run_until_idle()
    assert (balance("a"), balance("b")) == (5, 6)


def test_an_op_sent_in_a_rolled_back_transaction_does_not_exist(durable_env):
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.signal_entity("tests.account", "a", "deposit", 5)
        raise RuntimeError("rollback")
    assert durable_env.run_until_idle() == 0
    assert EntityOp.objects.count() == 0


def test_an_op_that_raises_leaves_the_state_as_it_was_and_records_its_error(durable_env):
    durable.signal_entity("tests.account", "a", "deposit", 5)
    durable.signal_entity("tests.account", "a", "withdraw", 50)
    durable.signal_entity("tests.account", "a", "deposit", 1)
    durable_env.run_until_idle()
    assert durable.entity_state("tests.account", "a") == {"balance": 6, "log": [5, 1]}
    failed = EntityOp.objects.get(op="withdraw")
    assert failed.status == OpStatus.FAILED
    assert failed.error["code"] == "insufficient_funds"
    assert failed.error["message"] == "insufficient funds"


@pytest.mark.parametrize(
    ("op", "said"),
    [
        ("pair_result", "the result of entity 'tests.account' op 'pair_result' is a tuple"),
        ("pair_in_state", "the state left by entity 'tests.account' op 'pair_in_state' at last is a tuple"),
    ],
)
def test_an_op_that_leaves_a_tuple_fails_as_it_would_read_back_as_a_list(durable_env, op, said):
    durable.signal_entity("tests.account", "a", "deposit", 5)
    durable.signal_entity("tests.account", "a", op)
    durable_env.run_until_idle()
    failed = EntityOp.objects.get(op=op)
    assert failed.status == OpStatus.FAILED
    assert said in failed.error["message"] and "pass a list" in failed.error["message"]
    assert durable.entity_state("tests.account", "a") == {"balance": 5, "log": [5]}


def test_a_tuple_argument_is_refused_from_outside_and_from_a_workflow(durable_env):
    with pytest.raises(durable.InvalidInput, match=r"op 'deposit' at \[1\] is a tuple; .* pass a list"):
        durable.signal_entity("tests.account", "a", "deposit", [1, (2, 3)])
    run = durable.start(sends_a_tuple, "b")
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed, match="op 'deposit' is a tuple"):
        durable.result(run.id)
    assert EntityOp.objects.count() == 0


def test_a_value_with_no_json_form_is_refused_saying_how_to_convert_it(durable_env):
    from decimal import Decimal

    with pytest.raises(durable.InvalidInput, match=r"convert it first \(\.model_dump\(mode='json'\)"):
        durable.signal_entity("tests.account", "a", "deposit", Decimal("1.5"))
    assert EntityOp.objects.count() == 0


@pytest.mark.parametrize("op", ["corrupt", "bad_result"])
def test_an_op_that_leaves_something_not_json_fails_and_changes_nothing(durable_env, op):
    durable.signal_entity("tests.account", "a", "deposit", 5)
    durable.signal_entity("tests.account", "a", op)
    durable_env.run_until_idle()
    failed = EntityOp.objects.get(op=op)
    assert failed.status == OpStatus.FAILED
    assert failed.error["type"] == "InvalidInput"
    assert "JSON" in failed.error["message"]
    assert durable.entity_state("tests.account", "a") == {"balance": 5, "log": [5]}


def test_an_op_knows_its_entity_name_and_key(durable_env):
    durable.signal_entity("tests.account", "k1", "whoami", op_id="w")
    durable_env.run_until_idle()
    assert EntityOp.objects.get(op_id="w").result == ["tests.account", "k1"]


def test_an_op_may_signal_another_entity_in_its_own_transaction(durable_env):
    durable.signal_entity("tests.account", "a", "deposit", 10)
    durable.signal_entity("tests.account", "a", "transfer", {"to": "b", "amount": 4})
    durable_env.run_until_idle()
    assert (balance("a"), balance("b")) == (6, 4)


def test_what_a_raising_op_sent_is_undone_with_it(durable_env):
    durable.signal_entity("tests.account", "a", "transfer_then_fail", {"to": "b", "amount": 4})
    durable_env.run_until_idle()
    assert EntityOp.objects.get(op="transfer_then_fail").status == OpStatus.FAILED
    assert not EntityOp.objects.filter(key="b").exists()
    assert balance("b") == 0


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: durable.signal_entity("tests.nope", "a", "deposit", 1), "name"),
        (lambda: durable.signal_entity("tests.account", "a", "steal", 1), "op"),
        (lambda: durable.signal_entity("tests.account", "a", "initial_state"), "op"),
        (lambda: durable.signal_entity("tests.account", "a", "deposit", object()), "the argument"),
        (lambda: durable.signal_entity("tests.account", "", "deposit", 1), "key"),
        (lambda: durable.signal_entity("tests.account", "a", "deposit", 1, op_id=7), "op_id"),
        (lambda: durable.entity_state("tests.nope", "a"), "name"),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(durable_env, call, field):
    with pytest.raises(durable.InvalidInput) as caught:
        call()
    assert field in str(caught.value)
    assert EntityOp.objects.count() == 0
    assert durable_env.pending() == []


def test_a_lost_prompt_is_repaired_by_the_sweep(durable_env):
    durable.signal_entity("tests.account", "a", "deposit", 5)
    assert [m.task for m in durable_env.drop()] == [dispatch.APPLY_ENTITY]
    assert durable_env.sweep() == 0  # too young: its prompt may still be on its way
    assert balance("a") == 0
    durable_env.advance_time("10s")
    assert balance("a") == 5
    assert EntityOp.objects.get().status == OpStatus.APPLIED


def test_a_prompt_that_comes_twice_applies_nothing_twice(durable_env):
    durable.signal_entity("tests.account", "a", "deposit", 5)
    (message,) = durable_env.pending()
    durable_env.messages.append(message)
    durable_env.run_until_idle()
    assert entity_ops.apply("tests.account", "a") == 0
    assert balance("a") == 5


def test_a_prompt_for_a_key_without_ops_creates_nothing_harmful(durable_env):
    assert entity_ops.apply("tests.account", "empty") == 0
    assert durable.entity_state("tests.account", "empty") == {"balance": 0, "log": []}


def test_a_backlog_longer_than_a_batch_is_applied_in_order(durable_env, monkeypatch):
    monkeypatch.setattr(entity_ops, "BATCH", 3)
    monkeypatch.setattr(entity_ops, "MAX_BATCHES", 2)
    for amount in range(1, 11):
        durable.signal_entity("tests.account", "a", "deposit", amount)
    durable_env.run_until_idle()
    assert durable.entity_state("tests.account", "a")["log"] == list(range(1, 11))


def test_a_key_written_by_a_newer_version_is_left_to_workers_that_have_it(durable_env):
    durable.signal_entity("tests.account", "a", "deposit", 5)
    durable_env.run_until_idle()
    Entity.objects.filter(key="a").update(version="2")
    durable.signal_entity("tests.account", "a", "deposit", 5)
    durable_env.run_until_idle()
    assert EntityOp.objects.filter(status=OpStatus.PENDING).count() == 1
    assert balance("a") == 5


# -- from workflows ------------------------------------------------------------------------


def test_a_workflow_signals_and_calls_an_entity_and_gets_the_results(durable_env):
    run = durable.start(pay, {"key": "w", "amount": 5})
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"balance": 15, "after": ["tests.account", "w"]}
    kinds = list(Checkpoint.objects.filter(run_id=run.id).values_list("kind", "name", "status"))
    assert kinds == [
        ("entity", "tests.account:deposit", "completed"),
        ("entity", "tests.account:deposit", "completed"),
        ("entity", "tests.account:whoami", "completed"),
    ]
    ops = EntityOp.objects.order_by("id")
    assert [op.op_id for op in ops] == [f"run:{run.id}:{seq}" for seq in range(3)]


def test_replays_never_send_an_op_again(durable_env):
    run = durable.start(pay, {"key": "w", "amount": 5})
    durable_env.run_until_idle()
    assert EntityOp.objects.count() == 3
    # Replay the finished history from the top, as a turn after a crash would.
    with forging():
        durable.models.Run.objects.filter(id=run.id).update(status="suspended", output=None)
    turn.advance(run.id)
    durable_env.run_until_idle()
    assert EntityOp.objects.count() == 3
    assert balance("w") == 15
    assert durable.result(run.id) == {"balance": 15, "after": ["tests.account", "w"]}


def test_a_redelivered_turn_sends_nothing_again_and_lost_prompts_are_swept(durable_env):
    run = durable.start(pay, {"key": "w", "amount": 5})
    durable_env.run_next()  # the first turn: a signal and a call stored, the call waits
    assert EntityOp.objects.count() == 2
    durable_env.drop(dispatch.APPLY_ENTITY)  # their prompts are lost
    turn.advance(run.id)  # and the turn's message comes again
    assert EntityOp.objects.count() == 2
    durable_env.advance_time("10s")
    assert durable.result(run.id) == {"balance": 15, "after": ["tests.account", "w"]}
    assert EntityOp.objects.count() == 3


def test_an_op_that_raises_fails_the_call_with_step_failed(durable_env):
    run = durable.start(overdraw, "poor")
    durable_env.run_until_idle()
    assert durable.result(run.id) == {"code": "insufficient_funds", "message": "insufficient funds"}
    assert durable.entity_state("tests.account", "poor") == {"balance": 0, "log": []}


def test_a_call_past_its_timeout_raises_wait_timeout(durable_env):
    run = durable.start(call_with_timeout, "slow")
    durable_env.run_next()
    durable_env.drop(dispatch.APPLY_ENTITY)
    # The op's prompt is lost and the sweep has not found it when the timeout passes; the op
    # still applies later, once.
    EntityOp.objects.update(created_at=durable_env.now() + timedelta(hours=1))
    durable_env.advance_time("2m")
    assert durable.result(run.id).startswith("timed out: entity 'tests.account' key 'slow'")
    EntityOp.objects.update(created_at=durable_env.now())
    durable_env.advance_time("10s")
    assert balance("slow") == 1
    assert Checkpoint.objects.get(run_id=run.id, kind="entity").status == "failed"


def test_an_unknown_op_from_a_workflow_fails_the_run_clearly(durable_env):
    run = durable.start(unknown_op)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed) as caught:
        durable.result(run.id)
    assert "has no operation 'steal'" in str(caught.value)
    assert EntityOp.objects.count() == 0


@durable.workflow(name="tests.entities_many_callers")
def many_callers(ctx, n):
    return ctx.call_entity("tests.account", "shared", "deposit", n)


def test_many_workflows_calling_one_key_each_get_their_own_result(durable_env):
    runs = [durable.start(many_callers, n) for n in range(1, 21)]
    durable_env.run_until_idle()
    results = [durable.result(r.id) for r in runs]
    assert balance("shared") == sum(range(1, 21))
    assert sorted(results) == sorted(set(results))  # each a different running balance
    log = durable.entity_state("tests.account", "shared")["log"]
    running = [sum(log[: i + 1]) for i in range(len(log))]
    assert sorted(results) == running


def test_settled_ops_beyond_entity_ops_kept_are_pruned_newest_kept(durable_env, settings):
    settings.DURABLE = {"ENTITY_OPS_KEPT": 3}
    for amount in range(1, 9):
        durable.signal_entity("tests.account", "a", "deposit", amount, op_id=f"op-{amount}")
        durable_env.run_until_idle()
    kept = list(EntityOp.objects.filter(key="a").order_by("id").values_list("op_id", flat=True))
    assert len(kept) <= 2 * 3 and kept[-3:] == ["op-6", "op-7", "op-8"]
    assert "op-1" not in kept
    assert balance("a") == 36
    assert Entity.objects.get(key="a").applied == 8


@durable.workflow(name="tests.entities_must_withdraw")
def must_withdraw(ctx, key):
    return ctx.call_entity("tests.account", key, "withdraw", 5)


def test_a_retried_run_sends_the_op_that_failed_it_again_under_a_new_id(durable_env):
    run = durable.start(must_withdraw, "r")
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed):
        durable.result(run.id)
    durable.signal_entity("tests.account", "r", "deposit", 7)
    durable.retry(run.id)
    durable_env.run_until_idle()
    assert durable.result(run.id) == 2
    ops = EntityOp.objects.filter(caller_run_id=run.id).order_by("id")
    assert [(op.op_id, op.status) for op in ops] == [
        (f"run:{run.id}:0", "failed"),
        (f"run:{run.id}:0#1", "applied"),
    ]
    assert Checkpoint.objects.get(run_id=run.id).input["op_id"] == f"run:{run.id}:0#1"


@durable.entity("tests.broken_start")
class BrokenStart:
    def initial_state(self):
        return {"tags": {"a", "b"}}  # a set: not JSON

    def touch(self, state, _):
        return "touched"


@durable.workflow(name="tests.entities_broken_start")
def touch_broken(ctx, _):
    try:
        return ctx.call_entity("tests.broken_start", "x", "touch")
    except durable.StepFailed as exc:
        return exc.message


def test_an_initial_state_that_is_not_json_fails_the_ops_clearly_and_applies_none(durable_env):
    durable.signal_entity("tests.broken_start", "x", "touch")
    run = durable.start(touch_broken)
    durable_env.run_until_idle()
    assert "the initial state of entity 'tests.broken_start'" in durable.result(run.id)
    assert set(EntityOp.objects.filter(entity="tests.broken_start").values_list("status", flat=True)) == {
        "failed"
    }
    assert not Entity.objects.filter(name="tests.broken_start").exists()
    with pytest.raises(durable.InvalidInput, match="must be JSON-serialisable"):
        durable.entity_state("tests.broken_start", "x")


def test_an_op_may_start_a_workflow_and_a_raising_op_starts_none(durable_env):
    durable.signal_entity("tests.account", "a", "open_case", "c1")
    durable.signal_entity("tests.account", "a", "open_case_then_fail", "c2")
    durable_env.run_until_idle()
    assert durable.result("case-c1") == {"balance": 11, "after": ["tests.account", "c1"]}
    assert not durable.models.Run.objects.filter(id="case-c2").exists()
    assert EntityOp.objects.get(op="open_case_then_fail").error["message"] == "no case after all"
