"""What the benchmarks run, importable by the worker (``--include bench.workloads``).

Every durable workload has a Celery or DBOS twin doing the same work: ten no-op steps.
"""

from __future__ import annotations

from celery import shared_task

import durable

STEPS = 10


# -- durable ------------------------------------------------------------------------------------


@durable.step(name="bench.noop_step")
def noop_step(i: int) -> int:
    """A dispatched step: a worker of the durable queue runs it in place, inside the turn."""
    return i


@durable.step(name="bench.noop_step_timed", timeout="30s")
def noop_step_timed(i: int) -> int:
    """A dispatched step with a timeout, as most real steps have: durable enforces it wherever
    the step runs, so a worker of its queue runs it in place too."""
    return i


@durable.step(name="bench.noop_local", local=True)
def noop_local(i: int) -> int:
    """A local step: runs inside the workflow turn, no broker hop."""
    return i


def _ten(ctx: durable.Context, step: durable.Step) -> int:
    return sum(ctx.step(step, i) for i in range(STEPS))


@durable.workflow(name="bench.dispatched10")
def dispatched10(ctx: durable.Context, _input: object) -> int:
    return _ten(ctx, noop_step)


@durable.workflow(name="bench.dispatched10_timed")
def dispatched10_timed(ctx: durable.Context, _input: object) -> int:
    """``dispatched10`` whose steps declare ``timeout="30s"``."""
    return _ten(ctx, noop_step_timed)


@durable.workflow(name="bench.local10")
def local10(ctx: durable.Context, _input: object) -> int:
    return _ten(ctx, noop_local)


@durable.workflow(name="bench.one_step")
def one_step(ctx: durable.Context, _input: object) -> int:
    """The result benchmark's workflow: one step, run in place by the worker that runs the turn."""
    return ctx.step(noop_step, 1)


@durable.workflow(name="bench.parked")
def parked(ctx: durable.Context, _input: object) -> None:
    """The workflow named by the rows the sweep benchmarks insert (never actually run there)."""
    ctx.sleep("1h")


# -- the Celery peer ----------------------------------------------------------------------------
# Intermediate links store no result (as a chain needs none); the last one stores its result in
# the project's result backend (django-db, i.e. the same PostgreSQL), where the bench polls it.


@shared_task(name="bench.noop", ignore_result=True)
def noop(i: int) -> int:
    return i


@shared_task(name="bench.noop_last")
def noop_last(i: int) -> int:
    return i


@shared_task(name="bench.where")
def where() -> dict[str, str]:
    """Where the worker imported the measured code from (the runner checks it is the copy)."""
    import durable
    import project.settings

    return {"durable": durable.__file__, "project.settings": project.settings.__file__}


def celery_chain():
    """The Celery twin of ``dispatched10``: a chain of ten no-op tasks."""
    from celery import chain

    return chain(*[noop.si(i) for i in range(STEPS - 1)], noop_last.si(STEPS - 1))


@durable.workflow(name="bench.local1")
def local1(ctx: durable.Context, _input: object) -> int:
    """The RSS family's workload: one turn and one local step per run, so 10,000 runs stay cheap."""
    return ctx.step(noop_local, 1)
