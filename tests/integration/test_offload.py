"""Large payloads (claim check, API.md §10): a payload past OFFLOAD_BYTES goes to OFFLOAD_STORAGE
and its row keeps a reference; readers get the value back; deleting runs (``delete_run``, the
retention sweep) deletes the objects; a rolled-back write's object goes after a grace period; a
missing object fails its reader with ``payload_missing``; columns rewritten in place never
offload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.fernet import Fernet as FernetKeys
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import override_settings

import durable
from durable import conf
from durable.engine import offloads as offload_sweep
from durable.engine import reencode
from durable.engine.retention import sweep_retention
from durable.errors import PayloadMissing
from durable.models import Checkpoint, CronSchedule, Entity, OffloadedPayload, Run, Signal
from durable.models.offloads import PREFIX

pytestmark = pytest.mark.django_db

BIG = 5 * 1024 * 1024
MARKER = "Okapi-Narwhal-4417"
KEY = FernetKeys.generate_key().decode()


@pytest.fixture
def store(tmp_path: Path):
    """A filesystem storage of the test's own, with MAX_PAYLOAD_BYTES raised past 5 MB."""
    storages = {
        **settings.STORAGES,
        "payloads": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": tmp_path},
        },
    }
    durable_settings = {
        **settings.DURABLE,
        "MAX_PAYLOAD_BYTES": 8 * 1024 * 1024,
        "OFFLOAD_STORAGE": "payloads",
    }
    with override_settings(STORAGES=storages, DURABLE=durable_settings):
        yield tmp_path / PREFIX


def objects(folder: Path) -> list[Path]:
    return sorted(folder.glob("*")) if folder.exists() else []


def raw_column(table: str, column: str, **where: object) -> str:
    """A column's text as the database holds it (no field converter)."""
    conditions = " AND ".join(f"{name} = %s" for name in where)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {conditions}", list(where.values()))
        (value,) = cursor.fetchone()
    return value if isinstance(value, str) else json.dumps(value)  # psycopg parses jsonb


@durable.step(name="tests.offload.produce")
def produce(size):
    return MARKER + "x" * size


@durable.workflow(name="tests.offload.big")
def big(ctx, size):
    value = ctx.step(produce, size)
    return len(value)


@durable.workflow(name="tests.offload.echo")
def echo(ctx, size):
    return ctx.step(produce, size)


@durable.workflow(name="tests.offload.waits")
def waits(ctx, _=None):
    return len(ctx.wait_for_signal("note"))


@durable.workflow(name="tests.offload.exposes")
def exposes(ctx, size):
    ctx.expose("big", "y" * size)
    return None


def run_big(durable_env) -> str:
    run = durable.start(big, BIG)
    durable_env.run_until_idle()
    assert durable.result(run.id) == BIG + len(MARKER)
    return run.id


def test_a_step_returning_5_mb_keeps_a_row_under_1_kb_and_reads_back_equal(durable_env, store):
    run_id = run_big(durable_env)
    column = raw_column("durable_checkpoint", "output", run_id=run_id, seq=0)
    assert len(column) < 1024 and '"offloaded"' in column
    assert Checkpoint.objects.get(run_id=run_id, seq=0).output == MARKER + "x" * BIG
    assert len(objects(store)) == 1 == OffloadedPayload.objects.count()
    assert MARKER in objects(store)[0].read_text()


def test_a_run_output_past_the_threshold_is_offloaded_too(durable_env, store):
    run = durable.start(echo, BIG)
    durable_env.run_until_idle()
    assert durable.result(run.id) == MARKER + "x" * BIG
    assert len(raw_column("durable_run", "output", id=run.id)) < 1024
    assert len(objects(store)) == 2  # the step's output and the run's


def test_under_fernet_the_object_holds_no_plaintext(durable_env, store):
    with override_settings(
        DURABLE={**settings.DURABLE, "CODEC": "durable.codecs.Fernet", "CODEC_KEYS": [KEY]}
    ):
        run_id = run_big(durable_env)
        assert Checkpoint.objects.get(run_id=run_id, seq=0).output.startswith(MARKER)
        assert len(raw_column("durable_checkpoint", "output", run_id=run_id, seq=0)) < 1024
    (stored,) = objects(store)
    assert MARKER not in stored.read_text() and '"encoded"' in stored.read_text()


def test_a_payload_at_or_under_the_threshold_stays_in_its_row(durable_env, store):
    run = durable.start(big, 1000)
    durable_env.run_until_idle()
    assert MARKER in raw_column("durable_checkpoint", "output", run_id=run.id, seq=0)
    assert objects(store) == []


def test_offload_bytes_none_turns_it_off(durable_env, store):
    with override_settings(DURABLE={**conf.declared(), "OFFLOAD_BYTES": None}):
        run_id = run_big(durable_env)
        assert MARKER in raw_column("durable_checkpoint", "output", run_id=run_id, seq=0)
    assert objects(store) == []


def test_max_payload_bytes_still_bounds_the_value_before_offload(durable_env, store):
    with override_settings(DURABLE={**conf.declared(), "MAX_PAYLOAD_BYTES": 1024 * 1024}):
        run = durable.start(big, 2 * 1024 * 1024)
        durable_env.run_until_idle()
        with pytest.raises(durable.RunFailed, match="MAX_PAYLOAD_BYTES|larger"):
            durable.result(run.id)
    assert objects(store) == []


def test_delete_run_deletes_its_objects_and_their_rows(durable_env, store):
    run_id = run_big(durable_env)
    assert objects(store)
    durable.delete_run(run_id)
    durable_env.run_until_idle()  # the delete's commit
    assert objects(store) == []
    assert not OffloadedPayload.objects.exists()


def test_the_retention_sweep_deletes_the_objects_of_the_runs_it_deletes(durable_env, store):
    run_id = run_big(durable_env)
    with override_settings(DURABLE={**conf.declared(), "RETENTION": [{"max_age": "1h"}]}):
        # Past retention.DAY_GRACE too: the row by row path (the drop of a day: test_partitions).
        durable_env.advance_time("26h")
        sweep_retention()
        durable_env.run_until_idle()
    assert not Run.objects.filter(id=run_id).exists()
    assert objects(store) == []
    assert not OffloadedPayload.objects.exists()


def test_released_objects_left_by_a_crash_after_the_commit_go_at_the_next_sweep(durable_env, store):
    run_id = run_big(durable_env)
    # As if the process died right after the delete committed: rows marked, objects still there.
    OffloadedPayload.objects.update(released=True)
    Run.objects.filter(id=run_id).delete()
    assert objects(store)
    sweep_retention()
    assert objects(store) == []
    assert not OffloadedPayload.objects.exists()


def test_a_signal_payload_offloaded_goes_with_its_run(durable_env, store):
    run = durable.start(waits)
    durable_env.run_until_idle()
    durable.signal(run.id, "note", MARKER + "s" * 300_000)
    assert len(raw_column("durable_signal", "payload", run_id=run.id)) < 1024
    assert Signal.objects.get(run_id=run.id).payload.startswith(MARKER)
    durable_env.run_until_idle()
    assert durable.result(run.id) == len(MARKER) + 300_000
    assert len(objects(store)) == 2  # the signal's payload, and the wait's position that took it
    durable.delete_run(run.id)
    durable_env.run_until_idle()
    assert objects(store) == []


def test_an_object_whose_transaction_rolled_back_goes_after_the_grace_period(durable_env, store, monkeypatch):
    run = durable.start(exposes, 10)
    durable_env.run_until_idle()
    with pytest.raises(RuntimeError), transaction.atomic():
        Signal.objects.create(run_id=run.id, name="lost", payload="w" * 300_000, created_at=durable_env.now())
        raise RuntimeError("the process died before the commit")
    assert len(objects(store)) == 1 and not OffloadedPayload.objects.exists()
    monkeypatch.setattr(offload_sweep, "_next_orphan_scan", None)
    offload_sweep.sweep_offloads()
    assert len(objects(store)) == 1  # young: its transaction might still be open
    durable_env.advance_time("61m")  # runs the sweeps, the retention sweep's listing due again
    assert objects(store) == []


def test_an_object_with_its_row_is_never_taken_for_an_orphan(durable_env, store, monkeypatch):
    run_big(durable_env)
    durable_env.advance_time("2h")
    monkeypatch.setattr(offload_sweep, "_next_orphan_scan", None)
    offload_sweep.sweep_offloads()
    assert len(objects(store)) == 1


def test_a_missing_object_fails_its_reader_with_payload_missing(durable_env, store):
    run_id = run_big(durable_env)
    for path in objects(store):
        path.unlink()
    with pytest.raises(PayloadMissing) as missing:
        Checkpoint.objects.get(run_id=run_id, seq=0)
    assert missing.value.code == "payload_missing"
    assert "OFFLOAD_STORAGE" in missing.value.message


@pytest.mark.parametrize("write", ["complete", "complete_and_wake"])
def test_a_result_delivered_twice_leaves_no_object_behind(durable_env, store, write):
    """The second delivery's guarded write changes no row: the object its output was written to
    is referred to by nothing, and goes (at once, or at the next sweep) instead of staying."""
    run_id = run_big(durable_env)
    (kept,) = objects(store)
    now = durable_env.now()
    positions = Checkpoint.objects
    if write == "complete":
        assert not positions.complete(run_id, 0, 1, "z" * BIG, now)
    else:
        assert not positions.complete_and_wake(run_id, 0, 1, "z" * BIG, now, now, None).done
    offload_sweep.sweep_offloads()
    assert objects(store) == [kept] and OffloadedPayload.objects.count() == 1
    assert Checkpoint.objects.get(run_id=run_id, seq=0).output == MARKER + "x" * BIG


def test_columns_rewritten_in_place_are_never_offloaded(durable_env, store):
    assert [f.offload for f in (Run._meta.get_field("exposed"), Checkpoint._meta.get_field("progress"))] == [
        False,
        False,
    ]
    assert not Entity._meta.get_field("state").offload and not CronSchedule._meta.get_field("input").offload
    run = durable.start(exposes, 300_000)
    durable_env.run_until_idle()
    assert durable.query(run.id, "big") == "y" * 300_000
    exposed = raw_column("durable_run", "exposed", id=run.id)
    assert len(exposed) > 300_000 and '"offloaded"' not in exposed


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"OFFLOAD_STORAGE": "nowhere"}, "'nowhere' is not a key of STORAGES"),
        ({"OFFLOAD_BYTES": 0}, "OFFLOAD_BYTES"),
        ({"OFFLOAD_BYTES": "256k"}, "OFFLOAD_BYTES"),
    ],
)
def test_a_bad_offload_setting_stops_durable_from_loading(declared, message):
    with (
        override_settings(DURABLE={**conf.declared(), **declared}),
        pytest.raises(ImproperlyConfigured, match=message),
    ):
        conf.get()


def test_reencode_rewrites_an_offloaded_payload_under_the_new_key_and_drops_the_old_object(
    durable_env, store
):
    new = FernetKeys.generate_key().decode()
    with override_settings(
        DURABLE={**conf.declared(), "CODEC": "durable.codecs.Fernet", "CODEC_KEYS": [KEY]}
    ):
        run_id = run_big(durable_env)
    (old,) = objects(store)
    with override_settings(
        DURABLE={**conf.declared(), "CODEC": "durable.codecs.Fernet", "CODEC_KEYS": [new, KEY]}
    ):
        reencode.reencode()
        durable_env.run_until_idle()  # the rewrite's commit
        assert not old.exists() and len(objects(store)) == 1 == OffloadedPayload.objects.count()
        assert (
            sum(c.rewritten for c in reencode.reencode()) == 0
        )  # current now: a second pass rewrites nothing
    with override_settings(
        DURABLE={**conf.declared(), "CODEC": "durable.codecs.Fernet", "CODEC_KEYS": [new]}
    ):
        assert Checkpoint.objects.get(run_id=run_id, seq=0).output.startswith(MARKER)
