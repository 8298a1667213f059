"""``durable.update`` that answers: ``ctx.wait_for_update``, ``ctx.reply`` and ``update(wait=)``
through durable_env, with the faults that could lose or double a reply."""

from __future__ import annotations

import pytest
from django.db import transaction

import durable
from durable.engine import turn
from durable.models import Checkpoint, Run, Signal

pytestmark = pytest.mark.django_db

STEALS: list[str] = []


@durable.workflow(name="tests.replies_account")
def account(ctx, owner):
    name = owner
    while True:
        update = ctx.wait_for_update("rename")
        if update.payload == "close":
            ctx.reply(update, {"closed": name})
            return name
        old, name = name, update.payload
        ctx.reply(update, {"was": old, "now": name})


@account.validator("rename")
def _a_name(payload):
    if not isinstance(payload, str) or not payload:
        raise ValueError("a name is a non-empty string")


@durable.workflow(name="tests.replies_silent")
def silent(ctx, _):
    return ctx.wait_for_update("rename").payload  # never replies


@durable.step(local=True)
def steal_lease_once(run_id):
    """The first time, another worker takes the run over before the turn can write."""
    if not STEALS:
        STEALS.append(run_id)
        Run.objects.filter(id=run_id).update(locked_by="someone-else")
    return "ok"


@durable.workflow(name="tests.replies_loses_lease")
def loses_lease(ctx, _):
    update = ctx.wait_for_update("ask")
    ctx.reply(update, "the answer")
    ctx.expose("phase", "answered")
    ctx.step(steal_lease_once, ctx.run_id)
    return ctx.wait_for_signal("done")


@pytest.fixture(autouse=True)
def _clear():
    STEALS.clear()


def _replies(run_id):
    return list(Signal.objects.filter(run_id=run_id, is_update=True).values_list("payload", "reply"))


def test_update_without_wait_returns_the_id_of_the_stored_update(durable_env):
    run = durable.start(account, "ann")
    update_id = durable.update(run.id, "rename", "bob")
    row = Signal.objects.get(id=update_id)
    assert (row.name, row.payload, row.is_update, row.replied_at) == ("rename", "bob", True, None)


def test_the_body_receives_the_update_and_its_reply_is_kept_on_it(durable_env):
    run = durable.start(account, "ann")
    update_id = durable.update(run.id, "rename", "bob")
    durable_env.run_until_idle()
    assert Signal.objects.get(id=update_id).reply == {"was": "ann", "now": "bob"}
    history = list(Checkpoint.objects.filter(run_id=run.id).values_list("kind", "name", "input"))
    assert history[:2] == [
        ("update", "rename", {"timeout": None}),
        ("reply", "rename", {"update": update_id}),
    ]


def test_update_wait_returns_the_reply_once_it_is_there(durable_env):
    run = durable.start(account, "ann")
    durable.update(run.id, "rename", "bob", idempotency_key="rename-1")
    durable_env.run_until_idle()
    # The same key again sends nothing new and answers with the first update's reply.
    assert durable.update(run.id, "rename", "bob", wait="5s", idempotency_key="rename-1") == {
        "was": "ann",
        "now": "bob",
    }
    assert _replies(run.id) == [("bob", {"was": "ann", "now": "bob"})]


def test_update_wait_under_durable_env_raises_wait_timeout_naming_the_state(durable_env):
    run = durable.start(account, "ann")
    with pytest.raises(
        durable.WaitTimeout,
        match=r"no ctx.wait_for_update or ctx.wait_for_message took it yet\); the run is pending",
    ) as caught:
        durable.update(run.id, "rename", "bob", wait="5s")
    assert caught.value.details["status"] == "pending"
    assert "durable_env.run_until_idle()" in str(caught.value)
    assert len(_replies(run.id)) == 1  # the update itself is stored: only the wait gave up


def test_update_wait_on_a_run_that_ends_without_replying_raises_run_finished(durable_env):
    run = durable.start(silent)
    durable.update(run.id, "rename", "bob", idempotency_key="k")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "bob"
    with pytest.raises(durable.RunFinished, match="finished \\(completed\\) without replying"):
        durable.update(run.id, "rename", "bob", wait="5s", idempotency_key="k")


def test_update_refused_by_its_validator_stores_nothing_even_with_wait(durable_env):
    run = durable.start(account, "ann")
    with pytest.raises(durable.UpdateRejected, match="a name is a non-empty string"):
        durable.update(run.id, "rename", "", wait="5s")
    assert not Signal.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"wait": "soon"}, "wait"),
        ({"wait": -1}, "wait"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"idempotency_key": 7}, "idempotency_key"),
    ],
)
def test_update_refuses_bad_options_before_storing_anything(durable_env, kwargs, says):
    run = durable.start(account, "ann")
    with pytest.raises(durable.InvalidInput, match=says):
        durable.update(run.id, "rename", "bob", **kwargs)
    assert not Signal.objects.exists()


def test_updates_are_answered_in_arrival_order_each_once(durable_env):
    run = durable.start(account, "ann")
    ids = [durable.update(run.id, "rename", name) for name in ("bob", "cy", "close")]
    durable_env.run_until_idle()
    assert durable.result(run.id) == "cy"
    assert [Signal.objects.get(id=i).reply for i in ids] == [
        {"was": "ann", "now": "bob"},
        {"was": "bob", "now": "cy"},
        {"closed": "cy"},
    ]
    assert Checkpoint.objects.filter(run_id=run.id, kind="reply").count() == 3


def test_a_plain_signal_does_not_reach_a_wait_for_an_update(durable_env):
    run = durable.start(silent)
    durable.signal(run.id, "rename", "not vetted")
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    durable.update(run.id, "rename", "vetted")
    durable_env.run_until_idle()
    assert durable.result(run.id) == "vetted"


def test_a_reply_of_a_turn_that_lost_its_lease_is_written_by_the_next_turn_once(durable_env):
    run = durable.start(loses_lease)
    update_id = durable.update(run.id, "ask", None)
    assert turn.advance(run.id) == "lost"
    # The thief's write came first: the reply and the exposed value were fenced out with the turn.
    assert Signal.objects.get(id=update_id).replied_at is None
    assert Checkpoint.objects.filter(run_id=run.id).count() == 0
    assert durable.query(run.id, "phase") is None
    durable_env.advance_time("31s")  # the lease lapses; the orphan sweep hands the run on
    assert durable.get_run(run.id).status == "suspended"
    assert Signal.objects.get(id=update_id).reply == "the answer"
    assert Checkpoint.objects.filter(run_id=run.id, kind="reply").count() == 1
    assert durable.query(run.id, "phase") == "answered"
    durable.signal(run.id, "done", 1)
    durable_env.run_until_idle()
    assert durable.result(run.id) == 1
    assert Checkpoint.objects.filter(run_id=run.id, kind="reply").count() == 1


def test_a_reply_rolled_back_with_a_stale_turn_is_recorded_by_its_rerun(durable_env, monkeypatch):
    run = durable.start(account, "ann")
    durable_env.run_until_idle()
    update_id = durable.update(run.id, "rename", "bob")
    # A second update lands while the turn that answers the first runs: its settle is refused
    # (a wake arrived), everything it wrote rolls back, and the turn runs again.
    original, replays = turn._replay, []

    def replay_then_wake(run_row, *args, **kwargs):
        outcome = original(run_row, *args, **kwargs)
        replays.append(run_row.wakes)
        if len(replays) == 1:
            durable.update(run.id, "rename", "cy")
        return outcome

    monkeypatch.setattr(turn, "_replay", replay_then_wake)
    durable_env.run_until_idle()
    assert replays[0] < replays[1]  # the rerun read the run again after the refused settle
    assert [r for _, r in _replies(run.id)] == [{"was": "ann", "now": "bob"}, {"was": "bob", "now": "cy"}]
    assert Signal.objects.get(id=update_id).reply == {"was": "ann", "now": "bob"}
    assert Checkpoint.objects.filter(run_id=run.id, kind="reply").count() == 2


@durable.workflow(name="tests.replies_as_signal")
def as_signal(ctx, _):
    ctx.wait_for_signal("rename")  # takes the update as a plain signal: no reply can come
    return ctx.wait_for_signal("done")


def test_update_wait_returns_none_once_a_signal_wait_took_the_update(durable_env):
    run = durable.start(as_signal)
    durable.update(run.id, "rename", "bob", idempotency_key="k")
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "suspended"
    assert durable.update(run.id, "rename", "bob", wait="5s", idempotency_key="k") is None


def test_update_wait_inside_a_transaction_is_refused_before_storing_anything(durable_env, monkeypatch):
    run = durable.start(account, "ann")
    monkeypatch.setattr(durable_env.transport, "may_wait", True)  # as outside the harness
    refused = pytest.raises(durable.InvalidInput, match=r"wait cannot be used inside transaction.atomic\(\)")
    with refused, transaction.atomic():
        durable.update(run.id, "rename", "bob", wait="5s")
    assert not Signal.objects.exists()
