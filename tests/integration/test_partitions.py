"""A partitioned history (PostgreSQL): a day's runs and positions in a pair of partitions, dropped
whole by retention once every run of the day has expired, and kept while one must stay."""

from __future__ import annotations

import collections
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction
from django.test import override_settings

import durable
from durable import clock, conf, ids
from durable.engine import retention, steps, turn
from durable.models import Checkpoint, Run, Signal, partitions
from tests.integration import test_async_steps as async_steps
from tests.integration import test_offload
from tests.integration.test_offload import BIG, MARKER, objects, produce

#: test_offload's storage of the test's own, a fixture.
store = test_offload.store

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the history is partitioned on PostgreSQL"),
]

#: A day well past any policy of these tests, and noon of it.
PAST = (datetime.now(UTC) - timedelta(days=40)).date()
AT = datetime(PAST.year, PAST.month, PAST.day, 12, tzinfo=UTC)


@durable.step(name="tests.partitions.add")
def add(a, b):
    return a + b


@durable.workflow(name="tests.partitions.sum")
def summed(ctx, n):
    return ctx.step(add, n, 1)


@pytest.fixture
def past_day(monkeypatch):
    monkeypatch.setattr(retention, "_kept_until", {})
    assert partitions.ensure_days("default", PAST, PAST) in ([PAST], [])
    return partitions.day_of(PAST)


def _run(*, status="completed", finished_days_ago=35.0, parent=None, minute=0, run_id=None):
    started = AT + timedelta(minutes=minute)
    run_id = run_id or ids.run_id(int(started.timestamp() * 1e9))
    finished = (
        None
        if status in ("pending", "running", "suspended")
        else clock.now() - timedelta(days=finished_days_ago)
    )
    run = Run.objects.create(
        id=run_id,
        workflow="tests.partitions.kept",
        version="1",
        queue="durable",
        status=status,
        parent_id=parent,
        created_at=started,
        updated_at=started,
        finished_at=finished,
    )
    for seq in range(3):
        Checkpoint.objects.create(run=run, seq=seq, kind="step", name="s", status="completed")
    Signal.objects.create(run=run, name="go", created_at=started)
    return run


def _today(**fields) -> Run:
    """A bare run started now (its id in today's day), with ``fields``."""
    now = clock.now()
    return Run.objects.create(
        **{"id": ids.run_id(), "workflow": "w", "version": "1", "queue": "durable", **fields},
        created_at=now,
        updated_at=now,
    )


def _where(table: str, run_id: str) -> str:
    with connection.cursor() as cursor:
        key = "id" if table == partitions.RUNS else "run_id"
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {key} = %s LIMIT 1", [run_id])
        return cursor.fetchone()[0]


def _exists(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
        return bool(cursor.fetchone()[0])


def _sweep(*policies) -> int:
    with override_settings(DURABLE={"RETENTION": list(policies) or [{"max_age": "30d"}]}):
        return retention.sweep_retention()


def test_the_migration_made_the_days_ahead_and_a_run_and_its_positions_land_in_their_day(durable_env):
    made = [d.day for d in partitions.days("default")]
    today = datetime.now(UTC).date()
    assert {today + timedelta(days=n) for n in range(partitions.AHEAD)} <= set(made)
    run = durable.start(summed, 2)
    durable_env.run_until_idle()
    assert durable.result(run.id) == 3
    suffix = partitions.day_of(today).suffix
    assert _where(partitions.RUNS, run.id) == f"{partitions.RUNS}{suffix}"
    assert _where(partitions.HISTORY, run.id) == f"{partitions.HISTORY}{suffix}"
    # An id a caller chose lies in no day: the default partition holds it.
    chosen = durable.start(summed, 1, run_id="order-17")
    durable_env.run_until_idle()
    assert durable.result(chosen.id) == 2
    assert _where(partitions.RUNS, chosen.id) == f"{partitions.RUNS}_pdefault"


@durable.workflow(name="tests.partitions.two_steps")
def two_steps(ctx, n):
    return ctx.step(add, ctx.step(add, n, 1), 1)


#: The statements PostgreSQL plans (not BEGIN, SAVEPOINT and the like).
PLANNED = ("SELECT", "WITH", "UPDATE", "INSERT", "DELETE")


@durable.workflow(name="tests.partitions.then_async")
def then_async(ctx, n):
    # Its second step awaited on the process's loop, its outcome written by the loop's writers.
    return ctx.step(async_steps.double, ctx.step(add, n, 1))


def _partitions_planned(sql: str, params) -> list[str]:
    """The partitions of the history a statement's plan reads, once for each time it reads one,
    as PostgreSQL plans it for these parameters (as it plans each execution unless it keeps a
    generic plan)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        (plan,) = cursor.fetchone()[0]

    def relations(node):
        yield node.get("Relation Name", "")
        for child in node.get("Plans", []):
            yield from relations(child)

    return [
        name
        for name in relations(plan["Plan"])
        if name.startswith((f"{partitions.RUNS}_p", f"{partitions.HISTORY}_p"))
    ]


def _statements(act) -> list[tuple[str, object]]:
    """The statements PostgreSQL plans that ``act`` runs on this connection, with their parameters."""
    executed: list[tuple[str, object]] = []

    def kept(execute, sql, params, many, context):
        executed.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(kept):
        act()
    statements = [(sql, params) for sql, params in executed if sql.lstrip().upper().startswith(PLANNED)]
    assert statements
    return statements


def _planned_while(act) -> set[str]:
    """The history's partitions planned by the statements ``act`` runs on this connection."""
    return {name for sql, params in _statements(act) for name in _partitions_planned(sql, params)}


def _todays_pair() -> set[str]:
    suffix = partitions.day_of(datetime.now(UTC).date()).suffix
    return {f"{partitions.RUNS}{suffix}", f"{partitions.HISTORY}{suffix}"}


# A statement that reaches the run's rows through a join instead of naming its id is planned over
# every day made (two weeks ahead, and each day kept): milliseconds of planning per step on a
# connection that plans each execution (Django's own binding does).


@override_settings(DURABLE={"EAGER_STEPS": False})  # every step through the broker
def test_a_run_whose_steps_go_through_the_broker_plans_its_own_days_partitions_only(durable_env):
    transport = durable_env.transport
    served, transport.served_queues = transport.served_queues, {"durable"}
    run = None

    def act():
        nonlocal run
        run = durable.start(two_steps, 1)
        durable_env.drop()
        turn.advance(run.id)
        for _ in range(2):
            (message,) = durable_env.drop()
            steps.run_step(*message.args)

    try:
        planned = _planned_while(act)
    finally:
        transport.served_queues = served
    assert durable.result(run.id) == 3
    assert planned == _todays_pair()


@pytest.mark.parametrize(
    ("workflow", "args", "result"),
    [(two_steps, [1], 3), (then_async, [1], 4)],
    ids=["steps", "a step, then an async def step"],
)
def test_a_run_whose_steps_run_in_place_plans_its_own_days_partitions_only(
    durable_env, monkeypatch, workflow, args, result
):
    monkeypatch.setattr(durable_env.transport, "served_queues", {"durable"})  # a worker of its queue
    run = None

    def act():
        nonlocal run
        run = durable.start(workflow, *args)
        durable_env.run_until_idle()

    planned = _planned_while(act)
    assert durable.result(run.id) == result
    assert planned == _todays_pair()


@durable.step(name="tests.partitions.limited", concurrency=2)
def limited(n):
    return n + 1


@durable.workflow(name="tests.partitions.limited_fan")
def limited_fan(ctx, n):
    return sum(ctx.map(limited, range(n)))


@override_settings(DURABLE={"EAGER_STEPS": False})  # fan members cross the broker
def test_no_statement_of_a_limited_fan_both_names_its_run_and_reads_every_day(durable_env):
    # A limit's slots are counted over every run, so that count reads every day's partition. In
    # the statement that also takes the slot by the run's id, PostgreSQL's default plan cache
    # mode planned the whole statement afresh at every execution: the run's own day read once
    # more than the others gives such a statement away.
    run = None

    def act():
        nonlocal run
        run = durable.start(limited_fan, 4)
        durable_env.run_until_idle()

    statements = _statements(act)
    assert durable.result(run.id) == 10
    mixed = []
    for sql, params in statements:
        read = collections.Counter(_partitions_planned(sql, params))
        for table in (partitions.RUNS, partitions.HISTORY):
            times = [n for name, n in read.items() if name.startswith(f"{table}_p")]
            if len(times) > 1 and len(set(times)) > 1:
                mixed.append(sql)
    assert not mixed


def test_the_orphan_sweep_plans_each_partition_of_the_positions_once(durable_env):
    # It names no run, so it reads every day's partition; whether a run's step is in flight was
    # asked in six places of its statement, and each was planned over every partition.
    orphan = _today(status="running", locked_by="gone:1/x", locked_until=clock.now() - timedelta(minutes=5))
    outcome = {}

    def act():
        outcome.update(Run.objects.take_orphans(clock.now(), 10, 3, {"type": "Lost"}))

    statements = _statements(act)
    assert outcome["suspended"] == [(orphan.id, "durable")]
    (sql, params), *_ = [(sql, params) for sql, params in statements if "recovery_attempts" in sql]
    read = [name for name in _partitions_planned(sql, params) if name.startswith(partitions.HISTORY)]
    assert read and len(read) == len(set(read)) == len(partitions.days("default")) + 1


def test_a_day_whose_every_run_expired_is_dropped_whole_with_what_refers_to_it(durable_env, past_day):
    root = _run()
    _run(parent=root.id, minute=1)
    _run(minute=2, status="failed")
    # A run of today continued from one of the day: it stays, and forgets where it came from.
    successor = _today(status="suspended", continued_from_id=root.id)
    assert _sweep() == 3
    assert not _exists(f"{partitions.RUNS}{past_day.suffix}")
    assert not _exists(f"{partitions.HISTORY}{past_day.suffix}")
    assert list(Run.objects.values_list("id", flat=True)) == [successor.id]
    assert not Checkpoint.objects.exists() and not Signal.objects.exists()
    successor.refresh_from_db()
    assert successor.continued_from_id is None


@pytest.mark.parametrize(
    "keeps",
    [
        {"status": "running"},  # not finished
        {"finished_days_ago": 10},  # finished, not expired yet
        {"status": "failed"},  # kept longer by its own policy (below)
    ],
)
def test_a_day_holding_a_run_that_must_stay_is_kept_and_its_expired_runs_wait_a_day_more(
    durable_env, past_day, keeps
):
    expired = _run(finished_days_ago=30.5)
    kept = _run(minute=1, **keeps)
    policies = [{"statuses": ["completed"], "max_age": "30d"}, {"statuses": ["failed"], "max_age": "90d"}]
    assert _sweep(*policies) == 0
    assert _exists(f"{partitions.RUNS}{past_day.suffix}")
    assert set(Run.objects.values_list("id", flat=True)) == {expired.id, kept.id}
    # A day and a half past its policy, a run the day's drop cannot take goes row by row.
    Run.objects.filter(id=expired.id).update(finished_at=clock.now() - timedelta(days=31.5))
    assert _sweep(*policies) == 1
    assert list(Run.objects.values_list("id", flat=True)) == [kept.id]
    assert _exists(f"{partitions.RUNS}{past_day.suffix}")


def test_a_day_whose_run_has_a_child_in_a_later_day_is_kept_until_the_tree_goes(durable_env, past_day):
    root = _run()
    _today(status="completed", parent_id=root.id, finished_at=clock.now() - timedelta(days=35))
    with override_settings(DURABLE={"RETENTION": [{"max_age": "30d"}]}):
        assert retention.drop_expired_days(conf.get(), clock.now()) == 0
        assert _exists(f"{partitions.RUNS}{past_day.suffix}")
        # Past the grace, the row path deletes the tree (the later child with it); the day, now
        # empty, goes whole at the next pass.
        Run.objects.filter(id=root.id).update(finished_at=clock.now() - timedelta(days=32))
        assert retention.sweep_retention() == 2
    assert not Run.objects.exists()


def test_a_day_whose_runs_are_being_written_is_left_for_the_next_pass(durable_env, past_day):
    run = _run()
    locked, release = threading.Event(), threading.Event()

    def writer() -> None:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("UPDATE durable_run SET updated_at = now() WHERE id = %s", [run.id])
                locked.set()
                release.wait(10)
                cursor.execute("ROLLBACK")
        finally:
            other.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert locked.wait(5)
        # The drop waits for the day's lock for partitions.LOCK_TIMEOUT, then gives up.
        with override_settings(DURABLE={"RETENTION": [{"max_age": "30d"}]}):
            assert retention.drop_expired_days(conf.get(), clock.now()) == 0
        assert _exists(f"{partitions.RUNS}{past_day.suffix}")
    finally:
        release.set()
        thread.join()
    assert _sweep() == 1
    assert not _exists(f"{partitions.RUNS}{past_day.suffix}")


def test_a_day_the_default_partition_holds_runs_of_is_left_to_it(durable_env, caplog):
    day = PAST - timedelta(days=3)
    stray = _run(
        run_id=ids.run_id(int(datetime(day.year, day.month, day.day, 9, tzinfo=UTC).timestamp() * 1e9))
    )
    assert _where(partitions.RUNS, stray.id) == f"{partitions.RUNS}_pdefault"
    assert partitions.ensure_days("default", day, day) == []
    assert "could not make the history's partitions" in caplog.text
    assert day not in [d.day for d in partitions.days("default")]
    # No constraint is left behind: the default partition takes the day's ids as before.
    later = _run(
        run_id=ids.run_id(int(datetime(day.year, day.month, day.day, 10, tzinfo=UTC).timestamp() * 1e9))
    )
    assert _where(partitions.RUNS, later.id) == f"{partitions.RUNS}_pdefault"


def _constraints_valid() -> bool:
    """Every key to runs validated, and every index of both tables valid (a partitioned table's
    index is valid once each partition has its own)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT bool_and(convalidated) FROM pg_constraint WHERE contype = 'f' AND confrelid IN "
            "(SELECT oid FROM pg_class WHERE relname LIKE 'durable\\_run%')"
        )
        keys = bool(cursor.fetchone()[0])
        cursor.execute(
            "SELECT bool_and(indisvalid), count(*) FROM pg_index WHERE indrelid IN (%s::regclass, %s::regclass)",
            [partitions.RUNS, partitions.HISTORY],
        )
        indexes, count = cursor.fetchone()
        return keys and indexes and count > 10


def _triggers(table: str) -> list[str]:
    """The names of ``table``'s own triggers (the run-end notice, the tests' status guards)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY 1",
            [table],
        )
        return [name for (name,) in cursor.fetchall()]


def test_a_filled_history_is_partitioned_in_place_and_back(durable_env):
    call_command("migrate", "durable", "0034_progress_at", verbosity=0)
    try:
        assert not partitions.is_partitioned("default")
        today = _run(finished_days_ago=1, run_id=ids.run_id())
        old = _run(minute=3)
        child = _run(minute=4, parent=old.id)
        chosen = _run(run_id="order-17")
        Run.objects.filter(id=chosen.id).update(continued_from_id=old.id)
        last_position = Checkpoint.objects.order_by("-id").values_list("id", flat=True)[0]
        rows = (Run.objects.count(), Checkpoint.objects.count(), Signal.objects.count())
        triggers = _triggers(partitions.RUNS)
        assert "durable_run_ended" in triggers
    finally:
        call_command("migrate", "durable", verbosity=0)
    assert partitions.is_partitioned("default")
    assert (Run.objects.count(), Checkpoint.objects.count(), Signal.objects.count()) == rows
    for run in (today, old, child, chosen):
        assert _where(partitions.RUNS, run.id) == f"{partitions.RUNS}_pdefault"
        assert _where(partitions.HISTORY, run.id) == f"{partitions.HISTORY}_pdefault"
    assert _constraints_valid()
    assert _triggers(partitions.RUNS) == _triggers(f"{partitions.RUNS}_pdefault") == triggers
    # A filled history is partitioned from tomorrow on: today's runs are being written.
    assert min(d.day for d in partitions.days("default")) == datetime.now(UTC).date() + timedelta(days=1)
    # The positions' ids go on from the old table's.
    assert (
        Checkpoint.objects.create(run=old, seq=9, kind="step", name="s", status="completed").id
        > last_position
    )
    # The run table's keys to itself hold on the partitioned table.
    with pytest.raises(IntegrityError), transaction.atomic():
        _today(id="orphan", status="pending", parent_id="nobody")
    # And back: the days' rows return to the plain tables.
    run = durable.start(summed, 4)
    durable_env.run_until_idle()
    noon = datetime.combine(
        datetime.now(UTC).date() + timedelta(days=1), datetime.min.time(), UTC
    ) + timedelta(hours=12)
    tomorrow = _run(status="running", run_id=ids.run_id(int(noon.timestamp() * 1e9)))
    assert (
        _where(partitions.HISTORY, tomorrow.id)
        == f"{partitions.HISTORY}{partitions.day_of(noon.date()).suffix}"
    )
    call_command("migrate", "durable", "0034_progress_at", verbosity=0)
    try:
        assert not partitions.is_partitioned("default")
        assert Run.objects.count() == rows[0] + 2 and durable.result(run.id) == 5
        assert Checkpoint.objects.filter(run_id=tomorrow.id).count() == 3
        assert _constraints_valid()
        assert _triggers(partitions.RUNS) == triggers
    finally:
        call_command("migrate", "durable", verbosity=0)


@durable.workflow(name="tests.partitions.big")
def big(ctx, blob):
    return len(ctx.step(produce, len(blob)))


def test_a_days_offloaded_payloads_go_with_the_day(durable_env, past_day, store):
    noon = int(AT.timestamp() * 1e9)
    run = durable.start(big, "y" * BIG, run_id=ids.run_id(noon))
    durable_env.run_until_idle()
    assert durable.result(run.id) == len(MARKER) + BIG
    assert len(objects(store)) == 2  # the run's input, the step's output
    Run.objects.filter(id=run.id).update(finished_at=clock.now() - timedelta(days=35))
    with override_settings(
        DURABLE={**conf.declared(), "OFFLOAD_STORAGE": "payloads", "RETENTION": [{"max_age": "30d"}]}
    ):
        assert retention.sweep_retention() == 1
    assert not _exists(f"{partitions.RUNS}{past_day.suffix}")
    assert objects(store) == []


def _drop_days_from(first) -> None:
    for day in partitions.days("default"):
        if day.day >= first:
            with transaction.atomic():
                partitions.drop_day("default", day)


def test_the_sweep_keeps_days_made_ahead_and_waits_an_hour_after_a_day_it_could_not_make(
    durable_env, monkeypatch, caplog
):
    monkeypatch.setattr(partitions, "_failed_at", None)
    later = datetime.now(UTC) + timedelta(days=60)
    tomorrow = later.date() + timedelta(days=1)
    try:
        made = partitions.ensure_ahead("default", later)
        assert made == [tomorrow + timedelta(days=n) for n in range(2 * partitions.AHEAD)]
        assert partitions.ensure_ahead("default", later) == []  # nothing missing
        # Eight days on, fewer than AHEAD days lie ahead; a run whose id lies in one of the next
        # days not made yet sits in the default partition.
        week = later + timedelta(days=partitions.AHEAD + 1)
        stray = later + timedelta(days=2 * partitions.AHEAD + 3)
        _run(run_id=ids.run_id(int(stray.timestamp() * 1e9)))
        assert partitions.ensure_ahead("default", week) == []
        assert caplog.text.count("could not make the history's partitions") == 1
        # The next passes within the hour leave it; after the hour it is tried again.
        assert partitions.ensure_ahead("default", week + timedelta(minutes=30)) == []
        assert caplog.text.count("could not make the history's partitions") == 1
        Run.objects.all().delete()
        assert partitions.ensure_ahead("default", week + timedelta(hours=1, minutes=1))
    finally:
        _drop_days_from(tomorrow)
