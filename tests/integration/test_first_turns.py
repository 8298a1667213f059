"""A run's first turn written ahead of any claim (PostgreSQL): read with its row's version,
replayed, and settled with the one position it starts in one statement fenced by that version.
A row written in between, or a first turn that does more than start one step, goes the usual
way; nothing runs twice and nothing is lost."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection, transaction

import durable
from durable import clock, conf, dispatch, values
from durable.engine import first_turns, histories
from durable.models import Checkpoint, Run, RunQuerySet, Status
from durable.models import result_and_turn as rows
from durable.statuses import CheckpointStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the fence is PostgreSQL's row version"),
]

RAN: list[str] = []


@durable.step
def charge(order):
    RAN.append(f"charge {order['id']}")
    return {"charged": order["total"], "at": dt.datetime(2026, 12, 7, 9, 30, tzinfo=dt.UTC)}


@durable.step(local=True)
def note(order):
    RAN.append(f"note {order['id']}")
    return order["id"]


@durable.workflow(name="tests.first_turns.charge")
def charged(ctx, order):
    return ctx.step(charge, order)


@durable.workflow(name="tests.first_turns.local_first")
def noted_then_charged(ctx, order):
    ctx.step(note, order)
    return ctx.step(charge, order)


LEAVE: list[BaseException] = []
#: The run whose replay the shutdown interrupts.
LEAVING: list[str] = []


@durable.workflow(name="tests.first_turns.leaving")
def charged_unless_leaving(ctx, order):
    if LEAVE and ctx.run_id in LEAVING:
        raise LEAVE.pop()  # what a prefork child's cold shutdown raises in a body, say
    return ctx.step(charge, order)


@durable.workflow(name="tests.first_turns.nap")
def napping(ctx, order):
    ctx.sleep("1m")
    return order["id"]


def _order(i: int) -> dict:
    return {"id": i, "total": Decimal("12.30")}


@pytest.fixture(autouse=True)
def _clean():
    RAN.clear()
    LEAVE.clear()
    LEAVING.clear()
    first_turns.unfit.clear()
    yield
    first_turns.unfit.clear()


@pytest.fixture
def claims(monkeypatch) -> list[str]:
    made: list[str] = []
    claim = RunQuerySet.claim

    def counted(self, run_id, *args, **kwargs):
        made.append(run_id)
        return claim(self, run_id, *args, **kwargs)

    monkeypatch.setattr(RunQuerySet, "claim", counted)
    return made


def test_a_first_turn_that_starts_one_step_is_written_without_a_claim(durable_env, claims):
    run = durable.start(charged, _order(1))
    assert durable_env.run_next().task == dispatch.ADVANCE
    assert claims == []
    row = Run.objects.get(id=run.id)
    assert (row.status, row.locked_by, row.recovery_attempts) == (Status.SUSPENDED, None, 0)
    assert row.started_at is not None
    assert [m.task for m in durable_env.pending()] == [dispatch.RUN_STEP]
    durable_env.run_until_idle()
    assert durable.result(run.id) == {
        "charged": Decimal("12.30"),
        "at": dt.datetime(2026, 12, 7, 9, 30, tzinfo=dt.UTC),
    }
    assert RAN == ["charge 1"]


def test_a_batch_of_runs_just_started_is_written_with_one_read_and_no_claim(durable_env, claims):
    with transaction.atomic():
        ids = [durable.start(charged, _order(i)).id for i in range(20)]
    first = durable_env.pending()
    assert dispatch.ADVANCE_BATCH in {m.task for m in first}
    for _ in first:
        durable_env.run_next()
    assert claims == []
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {Status.SUSPENDED}
    durable_env.run_until_idle()
    assert sorted(RAN) == sorted(f"charge {i}" for i in range(20))
    assert [durable.result(run_id)["charged"] for run_id in ids] == [Decimal("12.30")] * 20


def _versions(ids: list[str]) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, xmin::text FROM durable_run WHERE id = ANY(%s)", [ids])
        return dict(cursor.fetchall())


def test_the_first_turns_of_one_message_are_committed_together(durable_env, claims, monkeypatch):
    # Replayed one by one, written in one transaction: every run of the message carries the
    # same row version (the transaction that wrote it), and the lot cost one commit.
    monkeypatch.setattr(dispatch, "WAKE_SPREAD", 1)  # all in one message
    with transaction.atomic():
        ids = [durable.start(charged, _order(i)).id for i in range(12)]
    (message,) = durable_env.pending()
    assert message.task == dispatch.ADVANCE_BATCH
    durable_env.run_next()
    assert claims == []
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {Status.SUSPENDED}
    assert len(set(_versions(ids).values())) == 1
    assert [m.task for m in durable_env.pending()] == [dispatch.RUN_STEP] * 12
    durable_env.run_until_idle()
    assert sorted(RAN) == sorted(f"charge {i}" for i in range(12))


def test_each_first_turn_of_a_lot_has_its_span_from_its_replay_and_sends_in_it(durable_env, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from durable import tracing

    ids = [durable.start(charged, _order(i)).id for i in range(3)]
    durable_env.messages.clear()  # their first turns are written below, as one lot
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", lambda: provider)
    assert first_turns.ahead(ids, conf.get()) == dict.fromkeys(ids, Status.SUSPENDED)
    turns = [s for s in exporter.get_finished_spans() if s.name == "durable.turn tests.first_turns.charge"]
    assert sorted(s.attributes["durable.run_id"] for s in turns) == sorted(ids)
    for span in turns:
        assert span.context.trace_id == tracing.trace_id(span.attributes["durable.run_id"])
        assert span.attributes["durable.outcome"] == Status.SUSPENDED
    sent = durable_env.pending()
    assert [m.task for m in sent] == [dispatch.RUN_STEP] * 3
    parents = {s.attributes["durable.run_id"]: f"{s.context.span_id:016x}" for s in turns}
    for message in sent:
        assert parents[message.args[0]] in message.options["headers"]["traceparent"]


def test_a_first_turn_the_database_refuses_costs_only_its_own_run(durable_env, claims, monkeypatch):
    # One statement of the lot fails (a value too long for its column): the lot writes nothing,
    # each is written alone, and the one that fails again goes the usual way; each step runs once.
    monkeypatch.setattr(dispatch, "WAKE_SPREAD", 1)
    with transaction.atomic():
        ids = [durable.start(charged, _order(i)).id for i in range(3)]
    settle_firsts = rows.settle_firsts
    lots: list[int] = []

    def one_refused(db, firsts, fields):
        lots.append(len(firsts))
        for first in firsts:
            if first.run_id == ids[1]:
                first.inserting.name = "x" * 300
        return settle_firsts(db, firsts, fields)

    monkeypatch.setattr(rows, "settle_firsts", one_refused)
    durable_env.run_next()
    assert lots == [3, 1, 1, 1]
    statuses = dict(Run.objects.filter(id__in=ids).values_list("id", "status"))
    assert (statuses[ids[0]], statuses[ids[2]]) == (Status.SUSPENDED, Status.SUSPENDED)
    assert claims == [ids[1]]  # the usual turn, in the same message
    durable_env.run_until_idle()
    assert sorted(RAN) == ["charge 0", "charge 1", "charge 2"]
    assert [durable.result(run_id)["charged"] for run_id in ids] == [Decimal("12.30")] * 3


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not committed"])
def test_a_lot_whose_commit_went_unanswered_is_sent_again_and_each_step_runs_once(
    durable_env, monkeypatch, committed
):
    # The connection is lost around the lot's commit: whether it went through or not, every run's
    # unsent steps and its turn are sent again once the database answers.
    from django.db import OperationalError

    monkeypatch.setattr(dispatch, "WAKE_SPREAD", 1)
    with transaction.atomic():
        ids = [durable.start(charged, _order(i)).id for i in range(3)]
    settle_firsts = rows.settle_firsts

    def unanswered(db, firsts, fields):
        if committed:
            settle_firsts(db, firsts, fields)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(rows, "settle_firsts", unanswered)
    durable_env.run_next()  # the lot, then the usual turns of the same message
    monkeypatch.setattr(rows, "settle_firsts", settle_firsts)
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {Status.SUSPENDED}
    resent = [m.args[0] for m in durable_env.pending() if m.task == dispatch.ADVANCE]
    assert sorted(resent) == sorted(ids)
    durable_env.run_until_idle()
    assert sorted(RAN) == ["charge 0", "charge 1", "charge 2"]
    assert [durable.result(run_id)["charged"] for run_id in ids] == [Decimal("12.30")] * 3


def test_a_cold_shutdown_during_a_later_replay_sends_every_turn_of_the_lot_again(
    durable_env, claims, monkeypatch
):
    # Two runs of the message are replayed, not yet written, when the worker leaves in the
    # third's replay: nothing is written, and the three turns are sent again at once.
    from celery.worker import state

    from durable import celery as wiring  # noqa: F401 - its probe knows Celery's shutdown

    monkeypatch.setattr(dispatch, "WAKE_SPREAD", 1)
    with transaction.atomic():
        ids = [durable.start(charged_unless_leaving, _order(i)).id for i in range(3)]
    monkeypatch.setattr(state, "should_terminate", 1)
    # The message's runs are replayed in id order (the order they started in, but the harness's
    # clock stands still): the last of them.
    LEAVING[:] = [max(ids)]
    LEAVE.append(NotImplementedError("solo TaskPool does not implement kill_job"))
    with pytest.raises(NotImplementedError):
        durable_env.run_next()
    assert set(Run.objects.filter(id__in=ids).values_list("status", flat=True)) == {Status.PENDING}
    assert not Checkpoint.objects.filter(run_id__in=ids).exists()
    resent = durable_env.pending()
    assert sorted(m.args[0] for m in resent) == sorted(ids)
    assert {m.task for m in resent} == {dispatch.ADVANCE}
    monkeypatch.setattr(state, "should_terminate", None)  # the worker started again
    durable_env.run_until_idle()
    assert sorted(RAN) == ["charge 0", "charge 1", "charge 2"]


def test_a_row_written_since_the_read_refuses_the_write_and_the_usual_turn_runs(
    durable_env, claims, monkeypatch
):
    run = durable.start(charged, _order(2))
    replayed = first_turns._replayed

    def signalled_meanwhile(workflow, body_input, read, settings):
        out = replayed(workflow, body_input, read, settings)
        durable.signal(read.id, "unrelated", "now")  # a wake the read did not see
        return out

    monkeypatch.setattr(first_turns, "_replayed", signalled_meanwhile)
    durable_env.run_next()
    assert claims == [run.id]  # refused ahead: the usual turn claimed it
    assert Checkpoint.objects.filter(run_id=run.id, kind="step").count() == 1
    assert [m.task for m in durable_env.pending()].count(dispatch.RUN_STEP) == 1  # sent once
    durable_env.run_until_idle()
    assert durable.result(run.id)["charged"] == Decimal("12.30")
    assert RAN == ["charge 2"]


def test_a_first_turn_that_would_run_a_local_step_goes_the_usual_way_and_is_not_tried_again(
    durable_env, claims, monkeypatch
):
    tried: list[str] = []
    replayed = first_turns._replayed

    def counted(workflow, body_input, read, settings):
        tried.append(read.id)
        return replayed(workflow, body_input, read, settings)

    monkeypatch.setattr(first_turns, "_replayed", counted)
    first = durable.start(noted_then_charged, _order(3))
    durable_env.run_until_idle()
    assert claims[0] == first.id
    second = durable.start(noted_then_charged, _order(4))
    durable_env.run_next()
    assert tried == [first.id]  # the second run's first turn was not replayed ahead at all
    assert claims[-1] == second.id
    assert ("tests.first_turns.local_first", "1") in {(w, str(v)) for w, v in first_turns.unfit}
    durable_env.run_until_idle()
    assert sorted(RAN) == ["charge 3", "charge 4", "note 3", "note 4"]  # each once


def test_a_timer_first_is_written_ahead_and_fires(durable_env, claims):
    run = durable.start(napping, _order(5))
    durable_env.run_next()
    assert claims == []
    assert Run.objects.get(id=run.id).status == Status.SUSPENDED
    durable_env.advance_time("61s")
    durable_env.run_until_idle()
    assert durable.result(run.id) == 5


def test_a_run_already_claimed_or_started_is_not_read_as_fresh(durable_env):
    started = durable.start(charged, _order(6))
    waiting = durable.start(charged, _order(7))
    Run.objects.claim(started.id, "tests/owner", clock.now(), conf.get().LEASE)
    fresh = rows.fresh("default", [started.id, waiting.id, "no-such-run"], None)
    assert [run.id for run, _ in fresh] == [waiting.id]
    assert rows.fresh("default", [waiting.id], "another-namespace") == []


def _held(run: Run) -> Checkpoint:
    now = clock.now()
    return Checkpoint(
        run_id=run.id,
        seq=0,
        kind="step",
        name="tests.first_turns.charge",
        status=CheckpointStatus.PENDING,
        input=values.encode({"args": [_order(8)]}, what="the input"),
        enqueued_at=now,
        started_at=now,
        held_by="tests/holder",
        held_until=now + conf.get().LEASE,
        token="t0ken",
    )


def test_a_held_attempt_written_ahead_is_read_back_as_after_the_commit(durable_env):
    run = durable.start(charged, _order(8))
    ((read, version),) = rows.fresh("default", [run.id], None)
    fields = {"status": Status.SUSPENDED, "wake_at": None, "error": None}
    Run.objects.filter(id=run.id).update(wakes=read.wakes + 1)  # a wake since the read
    assert (
        rows.settle_first_holding(
            "default", run.id, version, clock.now(), fields, _held(read), histories.RECORD_FIELDS
        )
        is None
    )
    assert not Checkpoint.objects.filter(run_id=run.id).exists()
    ((read, version),) = rows.fresh("default", [run.id], None)
    held = rows.settle_first_holding(
        "default", run.id, version, clock.now(), fields, _held(read), histories.RECORD_FIELDS
    )
    assert held is not None
    row, taken = held
    after_row, after_taken = rows.held("default", run.id, 0, 1, "tests/holder", histories.RECORD_FIELDS)
    assert after_row is not None and after_taken is not None and taken is not None
    assert row.token == after_row.token == "t0ken"
    assert taken.version == after_taken.version
    assert taken.run.started_at == after_taken.run.started_at is not None
    assert Run.objects.get(id=run.id).status == Status.SUSPENDED


def test_a_lease_check_of_a_first_turn_that_ended_meanwhile_leaves_the_usual_turn_alone(
    durable_env, monkeypatch
):
    # The keeper reads the runs of the watches due, then marks lost those whose run was taken.
    # A first turn replayed ahead may end while it reads, and the usual turn claim the run and
    # watch it: the keeper's read is of a watch gone, and the turn holding the run is not lost.
    from durable.engine import leases

    run = durable.start(charged, _order(1))
    Run.objects.filter(id=run.id).update(status=Status.RUNNING, locked_by="worker-1")
    monkeypatch.setattr(leases, "HELD_CHECK_EVERY", 0.0)
    limit = conf.get().TURN_TIME_LIMIT
    leases.watch(run.id, leases.AHEAD, limit, lambda: None)
    leases._watched[run.id].checked = 0.0

    def taken_over_while_read(execute, sql, params, many, context):
        leases.unwatch(run.id)
        leases.watch(run.id, "worker-1", limit, lambda: None)
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(taken_over_while_read):
            leases._check_held(conf.get())
        assert leases._watched[run.id].owner == "worker-1"
        assert not leases.is_lost(run.id)
    finally:
        leases.unwatch(run.id)
        leases.lost.discard(run.id)
