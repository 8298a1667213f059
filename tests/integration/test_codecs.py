"""Payloads at rest under a codec (API.md §10): workflows behave as without one, no payload is
readable in the raw tables, keys rotate, ``manage.py durable reencode`` rewrites old rows, and a
row no key opens fails its reader with ``payload_undecodable``."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from celery import shared_task
from cryptography.fernet import Fernet as FernetKeys
from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

import durable
from durable.engine import reencode
from durable.errors import PayloadUndecodable
from durable.models import Checkpoint, Entity, Event, Run, Signal

pytestmark = pytest.mark.django_db

KEY_A, KEY_B = FernetKeys.generate_key().decode(), FernetKeys.generate_key().decode()
#: A string every payload of these workflows carries; no raw row may show it.
MARKER = "Zebra-Quokka-7731"


def under(*keys: str, codec=("durable.codecs.Zlib", "durable.codecs.Fernet")):
    return override_settings(DURABLE={**settings.DURABLE, "CODEC": list(codec), "CODEC_KEYS": list(keys)})


@durable.entity("tests.codecs.vault")
class Vault:
    def initial_state(self):
        return {"notes": []}

    def keep(self, state, note):
        state["notes"].append(note)
        return {"kept": note}


@durable.step(name="tests.codecs.remember")
def remember(note):
    return {"remembered": note, "price": Decimal("12.34")}


@durable.step(name="tests.codecs.remember_here", local=True)
def remember_here(note):
    return f"{note} (local)"


@durable.workflow(name="tests.codecs.everything")
def everything(ctx, given):
    step = ctx.step(remember, given["note"])
    local = ctx.step(remember_here, given["note"])
    paid = ctx.wait_for_signal("paid")
    ctx.expose("seen", {"paid": paid, "note": given["note"]})
    kept = ctx.call_entity("tests.codecs.vault", "v1", "keep", f"vault {given['note']}")
    ctx.sleep("1m")
    return {"step": step, "local": local, "paid": paid, "kept": kept}


@durable.workflow(name="tests.codecs.awaits_event")
def awaits_event(ctx, order):
    return ctx.wait_for_event("tests.codecs.paid", match={"order": order})


def run_everything(durable_env) -> str:
    run = durable.start(everything, {"note": MARKER})
    durable_env.run_until_idle()
    durable.signal(run.id, "paid", {"card": MARKER}, idempotency_key="pay-1")
    durable.signal(run.id, "paid", {"card": "again"}, idempotency_key="pay-1")  # a duplicate: dropped
    durable_env.run_until_idle()
    assert durable.query(run.id, "seen") == {"paid": {"card": MARKER}, "note": MARKER}
    durable_env.advance_time("2m")
    return run.id


def raw_rows_holding(text: str) -> list[str]:
    """``table: row`` of every durable row whose raw columns hold ``text``."""
    found = []
    with connection.cursor() as cursor:
        for model in apps.get_app_config("durable").get_models():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(model._meta.db_table)}")
            found += [f"{model._meta.db_table}: {row}" for row in cursor.fetchall() if text in repr(row)]
    return found


def test_a_workflow_under_fernet_behaves_as_without_and_leaves_no_payload_readable_in_the_tables(durable_env):
    with under(KEY_A):
        run_id = run_everything(durable_env)
        assert durable.result(run_id) == {
            "step": {"remembered": MARKER, "price": Decimal("12.34")},
            "local": f"{MARKER} (local)",
            "paid": {"card": MARKER},
            "kept": {"kept": f"vault {MARKER}"},
        }
        assert Signal.objects.filter(run_id=run_id).count() == 1
        assert durable.entity_state("tests.codecs.vault", "v1") == {"notes": [f"vault {MARKER}"]}
    assert raw_rows_holding(MARKER) == []
    assert raw_rows_holding("tests.codecs.remember")  # names stay plain, for querying


def test_the_same_workflow_without_a_codec_stores_its_payloads_as_plain_json(durable_env):
    run_id = run_everything(durable_env)
    assert durable.result(run_id)["paid"] == {"card": MARKER}
    assert raw_rows_holding(MARKER)


def test_an_idempotent_start_under_fernet_returns_the_run_already_started(durable_env):
    with under(KEY_A):
        first = durable.start(awaits_event, "o-1", run_id="order-o-1")
        again = durable.start(awaits_event, "o-1", run_id="order-o-1")
        assert first.id == again.id and Run.objects.count() == 1


def test_an_event_matched_on_its_payload_reaches_its_wait_under_a_codec(durable_env):
    with under(KEY_A):
        durable.publish_event("tests.codecs.paid", {"order": "o-2", "card": MARKER})
        durable.publish_event("tests.codecs.paid", {"order": "o-1", "card": MARKER})
        run = durable.start(awaits_event, "o-1")
        durable_env.run_until_idle()
        assert durable.result(run.id) == {"order": "o-1", "card": MARKER}
    assert raw_rows_holding(MARKER) == []


def test_plain_rows_written_before_a_codec_read_back_once_it_is_on(durable_env):
    run_id = run_everything(durable_env)
    with under(KEY_A):
        assert durable.result(run_id)["paid"] == {"card": MARKER}
        assert Checkpoint.objects.filter(run_id=run_id, kind="step").first().output["remembered"] == MARKER


def test_keys_rotate_and_reencode_rewrites_old_rows_under_the_first_key(durable_env):
    with under(KEY_A):
        run_id = run_everything(durable_env)
    with under(KEY_B, KEY_A):
        assert durable.result(run_id)["paid"] == {"card": MARKER}  # the old key still decrypts
        out = StringIO()
        call_command("durable", "reencode", "--dry-run", stdout=out)
        assert "would rewrite" in out.getvalue() and raw_rows_holding(MARKER) == []
        counts = reencode.reencode(batch=2)
        assert sum(c.rewritten for c in counts) > 0
        assert sum(c.rewritten for c in reencode.reencode()) == 0  # idempotent
    with under(KEY_B):
        assert durable.result(run_id)["paid"] == {"card": MARKER}
        assert Entity.objects.get(name="tests.codecs.vault").state == {"notes": [f"vault {MARKER}"]}
        assert Run.objects.get(id=run_id).exposed["seen"]["note"] == MARKER
    assert raw_rows_holding(MARKER) == []


def test_reencode_encodes_rows_stored_before_the_codec_was_turned_on(durable_env):
    run_id = run_everything(durable_env)
    assert raw_rows_holding(MARKER)
    with under(KEY_A):
        out = StringIO()
        call_command("durable", "reencode", stdout=out)
        assert "durable_run:" in out.getvalue() and "rewrote" in out.getvalue()
        assert durable.result(run_id)["paid"] == {"card": MARKER}
    assert raw_rows_holding(MARKER) == []


def test_a_row_no_configured_key_opens_fails_its_reader_with_payload_undecodable(durable_env):
    with under(KEY_A):
        durable.publish_event("tests.codecs.paid", {"order": "o-1", "card": MARKER})
    with under(KEY_B), pytest.raises(PayloadUndecodable) as refused:
        Event.objects.get()
    assert refused.value.code == "payload_undecodable"
    with under(KEY_B), pytest.raises(PayloadUndecodable, match="durable_event row"):
        reencode.reencode()
    with pytest.raises(PayloadUndecodable, match='DURABLE\\["CODEC"\\] is not set'):
        Event.objects.get()


@shared_task(name="tests.codecs.celery_add")
def celery_add(a, b=0):
    return a + b


@durable.workflow(name="tests.codecs.celery_step")
def celery_step(ctx, n):
    return ctx.step(celery_add, n, b=1)


def test_the_orphan_sweep_tells_celery_tasks_from_durable_steps_without_reading_an_encoded_input(durable_env):
    # A Celery task step is refused under a codec: this one was sent before the codec went on,
    # and its row encoded since (as ``reencode`` does).
    run = durable.start(celery_step, 1)
    durable_env.run_next()
    with under(KEY_A):
        Checkpoint.objects.filter(run_id=run.id).update(input={"args": [1], "kwargs": {"b": 1}, "task": True})
        sent = Checkpoint.objects.get(run_id=run.id)
        assert sent.task and sent.enqueued_at is not None and sent.started_at is None
        later = sent.enqueued_at + timedelta(hours=1)
        assert Checkpoint.objects.untaken_queues(later) == []
        Checkpoint.objects.filter(id=sent.id).update(task=False)  # as a durable step's row is
        assert Checkpoint.objects.untaken_queues(later) == [sent.queue]
