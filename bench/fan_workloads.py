"""What the fan benchmarks run, importable by the worker (``--include bench.workloads,bench.fan_workloads``).

A durable fan of N dispatched no-op steps and its Celery twin, a chord of N no-op tasks with a
sum callback. Both return sum(range(N)).
"""

from __future__ import annotations

from celery import shared_task

import durable
from bench.workloads import noop_step

# -- durable ------------------------------------------------------------------------------------


@durable.workflow(name="bench.fan")
def fan(ctx: durable.Context, n: int) -> int:
    """Fan out ``n`` dispatched no-op steps (``bench.noop_step``, one Celery task each), sum them."""
    return sum(ctx.map(noop_step, range(n)))


# -- the Celery peer ----------------------------------------------------------------------------
# A chord's header tasks must store their results (the callback is handed them), so unlike the
# chain's intermediate links these keep theirs, in the project's result backend (django-db).


@shared_task(name="bench.noop_kept")
def noop_kept(i: int) -> int:
    return i


@shared_task(name="bench.sum")
def total(values: list[int]) -> int:
    return sum(values)


def celery_chord(n: int):
    """The Celery twin of ``fan``: a chord of ``n`` no-op tasks with a sum callback."""
    from celery import chord

    return chord([noop_kept.si(i) for i in range(n)], total.s())
