"""Typed values end to end: a caller in this process, the workflow's turns and its step on a real
``celery worker`` on the configured broker and database; every standard type and a registered
dataclass cross each boundary and come back typed, on every turn the worker replays."""

from __future__ import annotations

import dataclasses
import uuid
from decimal import Decimal

import pytest

import durable
from durable.models import Run
from tests.typed_values import VALUES, typed

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@durable.register_type
@dataclasses.dataclass(frozen=True)
class Receipt:
    number: uuid.UUID
    total: Decimal


def check(what, value, expected):
    """Fail the run, naming ``what``, when the body sees other than ``expected``."""
    if typed(value) != typed(expected):
        raise durable.ApplicationError(f"{what}: got {typed(value)!r}", code="wrong_type")


@durable.step(name="tests.e2e_values.echo", retry=durable.Retry(max_attempts=1))
def echo(values):
    check("the step's argument", values, VALUES)
    return values


@durable.step(name="tests.e2e_values.charge", retry=durable.Retry(max_attempts=1))
def charge(total):
    check("charge's argument", total, VALUES["price"])
    return Receipt(VALUES["id"], total)


@durable.workflow(name="tests.e2e_values.flow")
def flow(ctx, given):
    check("the input", given, VALUES)
    echoed = ctx.step(echo, given)
    check("the step's output", echoed, VALUES)
    receipt = ctx.step(charge, given["price"])
    check("the receipt", receipt, Receipt(VALUES["id"], VALUES["price"]))
    paid = ctx.wait_for_signal("paid")  # the turn after it replays all of the above
    check("the signal's payload", paid, VALUES)
    check("the step's output on a replay", echoed, VALUES)
    return {"echoed": echoed, "receipt": receipt, "paid": paid}


def test_every_standard_type_and_a_registered_class_round_trip_through_a_real_worker(durable_worker):
    run = durable.start(flow, VALUES)
    stored = Run.objects.get(id=run.id).input
    assert stored["price"] == {"__durable__": "decimal", "v": "12.34"}  # tagged JSON in the row
    durable.signal(run.id, "paid", VALUES)
    result = durable.result(run.id, timeout="60s")
    assert typed(result) == typed(
        {"echoed": VALUES, "receipt": Receipt(VALUES["id"], VALUES["price"]), "paid": VALUES}
    )
