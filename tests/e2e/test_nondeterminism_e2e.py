"""On real workers: a deploy whose body calls ``random`` parks the runs already in flight (nothing
of their turns written, nothing failed), and the worker started with the fixed code resumes them
by itself, with no beat to bring their backoff timers."""

from __future__ import annotations

import os
import random

import pytest

import durable
from durable.models import Checkpoint, Run, Signal
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

#: Set in a worker's environment: "random" is the mistaken deploy, anything else the good code.
CODE = "DURABLE_E2E_NONDET_CODE"
RUNS = 4


@durable.step(name="tests.e2e_nondet.prepare")
def prepare(n: int) -> int:
    return n


@durable.step(name="tests.e2e_nondet.prepare_eu")
def prepare_eu(n: int) -> int:
    return n


@durable.step(name="tests.e2e_nondet.prepare_us")
def prepare_us(n: int) -> int:
    return n


@durable.step(name="tests.e2e_nondet.finish")
def finish(n: int, go: str) -> str:
    return f"{n} {go}"


@durable.workflow(name="tests.e2e_nondet.order")
def order(ctx, n):
    if os.environ.get(CODE) == "random":
        # The mistake: a step picked by the random module, not by ctx.random(), so a replay
        # asks for other than the history holds.
        ctx.step(random.choice([prepare_eu, prepare_us]), n)
    else:
        ctx.step(prepare, n)
    go = ctx.wait_for_signal("go")
    return ctx.step(finish, n, go)


def _waiting(run_ids: list[str]) -> bool:
    return Checkpoint.objects.filter(run_id__in=run_ids, kind="signal").count() == len(run_ids) and all(
        status == "suspended"
        for status in Run.objects.filter(id__in=run_ids).values_list("status", flat=True)
    )


def test_runs_parked_by_a_random_body_resume_when_a_worker_starts_with_the_fix(durable_worker):
    runs = [durable.start(order, n).id for n in range(RUNS)]
    wait_for(lambda: _waiting(runs), 60, what="every run to wait for its signal")
    recorded = Checkpoint.objects.filter(run_id__in=runs).count()

    durable_worker.primary.stop()
    mistaken = durable_worker.add_worker({CODE: "random"}, name="mistaken")
    for run_id in runs:
        durable.signal(run_id, "go", "went")
    wait_for(lambda: Run.objects.filter(id__in=runs).blocked().count() == RUNS, 60, what="every run parked")

    parked = list(Run.objects.filter(id__in=runs))
    assert {run.status for run in parked} == {"suspended"}
    assert {run.error["details"]["seq"] for run in parked} == {0}
    assert {run.error["details"]["recorded"][1] for run in parked} == {prepare.name}
    assert Checkpoint.objects.filter(run_id__in=runs).count() == recorded  # nothing of those turns
    assert not Signal.objects.filter(run_id__in=runs, consumed_seq__isnull=False).exists()

    mistaken.stop()
    durable_worker.add_worker(name="fixed")  # no beat: only its start can send them a turn now
    assert [durable.result(run_id, timeout=60) for run_id in runs] == [f"{n} went" for n in range(RUNS)]
    assert not Run.objects.filter(id__in=runs, error__isnull=False).exists()
