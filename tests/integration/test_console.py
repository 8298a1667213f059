"""``manage.py durable``: the operator's subcommands, and ``replay`` over 1,000 stored histories
finding the runs a changed workflow would break."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import durable
from durable import Retry
from durable.models import Checkpoint, Run
from durable.statuses import RunStatus
from durable.testing import replay_history

pytestmark = pytest.mark.django_db

STEPS_RUN: list[str] = []


@durable.step(name="tests.console.charge")
def charge(cents: int) -> str:
    STEPS_RUN.append("charge")
    return f"ch-{cents}"


@durable.step(name="tests.console.ship")
def ship(order: int) -> str:
    STEPS_RUN.append("ship")
    return f"parcel-{order}"


@durable.step(name="tests.console.courier")
def courier(order: int) -> str:
    STEPS_RUN.append("courier")
    return f"courier-{order}"


@durable.step(name="tests.console.notify", local=True)
def notify(order: int) -> None:
    STEPS_RUN.append("notify")


@durable.step(name="tests.console.broken", retry=Retry(max_attempts=1))
def broken() -> None:
    raise RuntimeError("the printer is on fire")


def fulfil_body(ctx, order):
    charged = ctx.step(charge, order["cents"])
    parcel = ctx.step(courier if order.get("express") else ship, order["id"])
    approved = ctx.wait_for_signal("delivered")
    ctx.step(notify, order["id"])
    return {"charged": charged, "parcel": parcel, "approved": approved}


fulfil = durable.workflow(name="tests.console.fulfil")(fulfil_body)


@durable.workflow(name="tests.console.fails")
def fails(ctx, _):
    ctx.step(broken)


def manage(*args: str) -> str:
    out = StringIO()
    call_command("durable", *args, stdout=out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def _clear():
    STEPS_RUN.clear()


def test_start_signal_show_and_list_drive_a_run_to_its_end(durable_env):
    run_id = manage("start", "tests.console.fulfil", '{"id": 7, "cents": 500}', "--run-id", "order-7").strip()
    assert run_id == "order-7"
    durable_env.run_until_idle()
    assert "suspended" in manage("list", "--workflow", "tests.console.fulfil")
    assert "signal 'delivered' sent" in manage("signal", "order-7", "delivered", '"yes"')
    durable_env.run_until_idle()
    shown = manage("show", "order-7")
    assert "status    completed" in shown
    assert "tests.console.ship" in shown and "tests.console.notify" in shown
    assert durable.result("order-7") == {"charged": "ch-500", "parcel": "parcel-7", "approved": "yes"}
    listed = manage("list", "--status", "completed")
    assert "order-7" in listed and "tests.console.fulfil@1" in listed


def test_bad_json_is_refused_naming_the_argument_and_nothing_is_stored(durable_env):
    with pytest.raises(CommandError, match="the input is not JSON"):
        manage("start", "tests.console.fulfil", "{id: 7}")
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("start", "tests.console.fulfil", "[" * 5000 + "]" * 5000), "the input is nested deeper than 100"),
        (("start", "tests.console.fulfil", "1" * 5001), "store it as a string"),
        (
            ("signal", "order-1", "delivered", "[" * 5000 + "]" * 5000),
            "the payload is nested deeper than 100",
        ),
    ],
    ids=["deep input", "huge input", "deep payload"],
)
def test_json_too_deep_or_too_long_is_refused_naming_the_argument(durable_env, args, said):
    durable.start(fulfil, {"id": 1, "cents": 1}, run_id="order-1")
    with pytest.raises(CommandError, match=said):
        manage(*args)
    assert list(Run.objects.values_list("id", flat=True)) == ["order-1"]
    assert not Run.objects.get(id="order-1").signals.exists()


def test_list_refuses_a_status_that_does_not_exist_naming_those_that_do(durable_env):
    said = _refused("list", "--status", "bogus")
    assert "'bogus'" in said
    assert all(f"'{status}'" in said for status in RunStatus)


def test_purge_refuses_a_status_that_is_not_finished_naming_the_finished_ones(durable_env):
    said = _refused("purge", "--older-than", "1d", "--status", "running")
    assert "'running'" in said
    assert "'completed', 'failed', 'cancelled', 'dead'" in said
    assert "RunStatus" not in said


@pytest.mark.parametrize(
    ("args", "valid"),
    [
        (("list", "--status", "bogus"), "'pending', 'running', 'suspended', 'completed'"),
        (
            ("purge", "--older-than", "1d", "--status", "pending"),
            "'completed', 'failed', 'cancelled', 'dead'",
        ),
    ],
    ids=["list", "purge"],
)
def test_an_unknown_status_exits_non_zero_in_a_real_process(args, valid):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "manage.py", "durable", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "invalid choice" in done.stderr and valid in done.stderr
    assert done.stdout == ""


def test_counts_are_said_in_the_singular_for_one(durable_env):
    failed = durable.start(fails)
    durable_env.run_until_idle()
    replayed = manage("replay", "--all")
    assert f"ok     {failed.id} tests.console.fails@1 (1 position)" in replayed
    assert "replayed 1 stored history: 0 would break" in replayed
    swept = manage("sweep")
    assert "recovered 0 orphaned runs, woke 0 due runs" in swept
    durable_env.advance_time("2d")
    assert "1 finished run tree would be deleted (dry run)" in manage(
        "purge", "--older-than", "1d", "--dry-run"
    )
    assert "deleted 1 run, children included" in manage("purge", "--older-than", "1d")


def test_an_api_error_becomes_a_command_error(durable_env):
    with pytest.raises(CommandError, match="no run has id 'nope'"):
        manage("signal", "nope", "delivered")


def test_redispatch_sends_a_lost_step_message_again(durable_env):
    run = durable.start(fulfil, {"id": 3, "cents": 30})
    durable_env.run_next()  # the first turn sends the charge step
    assert len(durable_env.drop()) == 1  # and the broker loses its message

    assert manage("redispatch", run.id).strip() == "1 step attempt sent again"
    durable_env.run_until_idle()

    assert STEPS_RUN == ["charge", "ship"]
    assert durable.get_run(run.id).status == "suspended"  # on to its wait for "delivered"


def test_cancel_and_retry(durable_env):
    waiting = durable.start(fulfil, {"id": 1, "cents": 1})
    durable_env.run_until_idle()
    assert "cancelled" in manage("cancel", waiting.id, "--reason", "customer called")
    durable_env.run_until_idle()
    assert durable.get_run(waiting.id).error["message"] == "customer called"
    failed = durable.start(fails)
    durable_env.run_until_idle()
    assert durable.get_run(failed.id).status == "failed"
    assert "retried" in manage("retry", failed.id)
    assert durable.get_run(failed.id).status == "pending"


def test_purge_deletes_finished_trees_older_than_asked(durable_env):
    old = durable.start(fails)
    durable_env.run_until_idle()
    durable_env.advance_time("2d")
    recent = durable.start(fails)
    waiting = durable.start(fulfil, {"id": 2, "cents": 1})
    durable_env.run_until_idle()
    assert "1 finished run tree would be deleted" in manage("purge", "--older-than", "1d", "--dry-run")
    assert Run.objects.count() == 3
    assert "deleted 1 run," in manage("purge", "--older-than", "1d")
    assert set(Run.objects.values_list("id", flat=True)) == {recent.id, waiting.id}
    assert not Run.objects.filter(id=old.id).exists()
    with pytest.raises(CommandError, match="older-than"):
        manage("purge", "--older-than", "soon")


def test_show_json_exports_a_history_that_replay_history_replays(durable_env, tmp_path):
    handle = durable.start(fulfil, {"id": 3, "cents": 300, "express": True})
    durable_env.run_until_idle()
    exported = manage("show", handle.id, "--json")
    path = tmp_path / "history.json"
    path.write_text(exported)
    assert json.loads(exported)["run"]["status"] == "suspended"
    assert replay_history(path).positions == 3
    changed = durable.workflow(name="tests.console.fulfil_changed")(_ship_always)
    with pytest.raises(durable.NonDeterminismError, match="tests.console.courier"):
        replay_history(path, changed)


def _ship_always(ctx, order):
    ctx.step(charge, order["cents"])
    ctx.step(ship, order["id"])  # the express branch is gone
    return ctx.wait_for_signal("delivered")


def _store_copies(template: Run, count: int, prefix: str) -> list[str]:
    """Store ``count`` copies of ``template``'s run and history, cheaply (two bulk inserts)."""
    positions = list(Checkpoint.objects.filter(run=template).order_by("seq"))
    runs, rows = [], []
    for i in range(count):
        run_id = f"{prefix}-{i:04d}"
        runs.append(copy.copy(template))
        runs[-1].id = run_id
        for position in positions:
            row = copy.copy(position)
            row.pk, row.run_id = None, run_id
            rows.append(row)
    Run.objects.bulk_create(runs)
    Checkpoint.objects.bulk_create(rows, batch_size=500)
    return [run.id for run in runs]


@pytest.fixture
def thousand_histories(durable_env):
    """1,000 stored histories of tests.console.fulfil: 990 ordinary orders (half of them done,
    half waiting for their signal) and 10 express ones, waiting."""
    done = durable.start(fulfil, {"id": 1, "cents": 100})
    waiting = durable.start(fulfil, {"id": 2, "cents": 200})
    express = durable.start(fulfil, {"id": 3, "cents": 300, "express": True})
    durable_env.run_until_idle()
    durable.signal(done.id, "delivered", True)
    durable_env.run_until_idle()
    assert durable.get_run(done.id).status == "completed"
    _store_copies(durable.get_run(done.id), 494, "done")
    _store_copies(durable.get_run(waiting.id), 494, "waiting")
    broken = _store_copies(durable.get_run(express.id), 9, "express")
    assert Run.objects.count() == 1000
    STEPS_RUN.clear()
    return [express.id, *broken]


def test_replay_passes_1000_histories_on_the_code_that_wrote_them(thousand_histories):
    out = manage("replay")
    assert "replayed 1000 stored histories: 0 would break" in out
    assert STEPS_RUN == []  # a replay check runs no step, not even the local one after the wait


def test_replay_finds_the_runs_a_changed_workflow_would_break_and_exits_non_zero(
    thousand_histories, monkeypatch, capsys
):
    # A deploy that drops the express branch: only the express runs' histories break.
    monkeypatch.setattr(fulfil, "fn", _ship_always)
    out = StringIO()
    with pytest.raises(CommandError, match="replayed 1000 stored histories: 10 would break") as failure:
        call_command("durable", "replay", stdout=out)
    assert failure.value.returncode == 1
    breaking = [line for line in out.getvalue().splitlines() if line.startswith("BREAKS")]
    assert sorted(line.split()[1] for line in breaking) == sorted(thousand_histories)
    assert all("NonDeterminismError" in line and "tests.console.courier" in line for line in breaking)
    assert STEPS_RUN == []


def test_replay_filters_by_run_workflow_and_since(thousand_histories, monkeypatch, durable_env):
    monkeypatch.setattr(fulfil, "fn", _ship_always)
    assert "replayed 2 stored histories: 0 would break" in manage(
        "replay", "--run", "done-0001", "--run", "waiting-0002"
    )
    with pytest.raises(CommandError, match="replayed 1 stored history: 1 would break"):
        manage("replay", "--run", thousand_histories[0])
    assert "replayed 0 stored histories" in manage("replay", "--workflow", "tests.console.fails")
    future = (durable_env.now() + timedelta(days=1)).isoformat()
    assert "replayed 0 stored histories" in manage("replay", "--since", future)
    assert "replayed 1000 stored histories: 10 would break" in _refused("replay", "--since", "1d")
    with pytest.raises(CommandError, match="--since takes an ISO date"):
        manage("replay", "--since", "yesterday")


def _refused(*args: str) -> str:
    with pytest.raises(CommandError) as refused:
        manage(*args)
    return str(refused.value)


def test_replay_reports_a_run_whose_workflow_version_is_no_longer_installed(durable_env):
    handle = durable.start(fulfil, {"id": 4, "cents": 1})
    durable_env.run_until_idle()
    Run.objects.filter(id=handle.id).update(version="0")
    with pytest.raises(CommandError, match="1 would break"):
        manage("replay")


@pytest.mark.django_db(transaction=True)
def test_manage_py_durable_replay_exits_1_in_a_real_process_when_a_history_breaks():
    import os
    import subprocess
    import sys

    from django.db import connection

    from durable import clock

    now = clock.now()
    Run.objects.create(
        id="shop-1",
        workflow="shop.fulfil",
        version="1",
        queue="durable",
        input={"id": 1, "items": []},
        status="suspended",
        created_at=now,
        updated_at=now,
    )
    position = Checkpoint.objects.create(
        run_id="shop-1",
        seq=0,
        kind="step",
        name="shop.price",
        status="completed",
        output=100,
        finished_at=now,
    )
    env = {**os.environ, "DURABLE_TEST_DATABASE_NAME": str(connection.settings_dict["NAME"])}

    def replay() -> subprocess.CompletedProcess:
        argv = [sys.executable, "manage.py", "durable", "replay"]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    passed = replay()
    assert passed.returncode == 0, passed.stderr
    assert "replayed 1 stored history: 0 would break" in passed.stdout
    # The history of a run written by code that priced the order another way.
    Checkpoint.objects.filter(pk=position.pk).update(name="shop.price_v0")
    broke = replay()
    assert broke.returncode == 1
    assert "BREAKS shop-1 shop.fulfil@1" in broke.stdout
    assert "1 would break" in broke.stderr
