"""A started run's row is written by one INSERT of its own (``RunQuerySet.add``), not the ORM's
``create()``; it must hold what ``create()`` would have written, and a receiver of Django's save
signals for runs must still hear every start."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.db.models.signals import post_save
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

import durable
from durable.models import Run

pytestmark = pytest.mark.django_db


@durable.workflow(name="tests.inserted", timeout="1h", tags=("billing",))
def inserted(ctx, value):
    return value


#: What differs between two starts of the same arguments.
OWN = {"id", "created_at", "updated_at", "wake_at", "deadline"}


def _start():
    return durable.start(
        inserted,
        {"amount": Decimal("12.50"), "items": [1, 2]},
        tags=["b", "a"],
        search_attributes={"customer": "acme"},
        priority=3,
        namespace="shop",
    )


def _row(run_id):
    return {k: v for k, v in model_to_dict(Run.objects.get(id=run_id)).items() if k not in OWN}


def test_a_start_is_one_insert_that_writes_what_the_orm_would(durable_env):
    with CaptureQueriesContext(connection) as captured:
        plain = _start()
    inserts = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1 and "durable_run" in inserts[0]
    assert "SAVEPOINT" not in " ".join(q["sql"] for q in captured.captured_queries)

    heard = []

    def noted(sender, instance, created, **kwargs):
        heard.append((instance.id, created))

    post_save.connect(noted, sender=Run)
    try:
        through_orm = _start()
    finally:
        post_save.disconnect(noted, sender=Run)
    assert heard == [(through_orm.id, True)]
    assert _row(plain.id) == _row(through_orm.id)
    first, second = Run.objects.get(id=plain.id), Run.objects.get(id=through_orm.id)
    assert first.wake_at - first.created_at == second.wake_at - second.created_at
    assert first.deadline - first.created_at == second.deadline - second.created_at


def test_a_run_written_by_its_own_insert_runs_to_its_end(durable_env):
    run = _start()
    durable_env.run_until_idle()
    row = Run.objects.get(id=run.id)
    assert row.status == "completed" and row.output == row.input


def test_a_start_with_an_id_in_use_returns_the_run_that_has_it(durable_env):
    first = durable.start(inserted, 1, run_id="tests-inserted-once")
    again = durable.start(inserted, 2, run_id="tests-inserted-once")
    assert again.id == first.id
    assert Run.objects.filter(id="tests-inserted-once").count() == 1
    assert Run.objects.get(id="tests-inserted-once").input == 1
