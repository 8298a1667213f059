"""Celery wiring: the sweeps' beat schedule, a worker's start-up and shutdown."""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from . import clock, conf, dispatch, routing, tracing

log = logging.getLogger("durable.celery")

CELERY_DEFAULT_PREFETCH = 4

#: When this worker process started: leases its instance id holds that were not renewed since
#: belong to a predecessor.
booted_at = clock.now()


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The sweeps as beat entries, for projects that build their schedule by hand."""
    from .engine.sweeps import SWEEPS

    settings = conf.get()
    entries = {}
    for sweep in SWEEPS:
        every = getattr(settings, sweep.interval).total_seconds()
        # A namespace's beat sends its sweeps to its namespace's workers, whose settings scope them.
        queue = routing.queue_in(settings.DEFAULT_QUEUE, settings.NAMESPACE)
        options = {"queue": queue, "expires": every * 5, "serializer": "json"}
        entries[sweep.task] = {"task": sweep.task, "schedule": every, "options": options}
    return entries


@signals.beat_init.connect
def _add_sweeps(sender: Any = None, **_: Any) -> None:
    # Entries the project defined itself (same key) win.
    scheduler = sender.scheduler
    missing = {k: v for k, v in beat_schedule().items() if k not in scheduler.schedule}
    if missing:
        scheduler.update_from_dict(missing)


@signals.celeryd_init.connect
def _prefetch_one(sender: Any = None, conf: Any = None, **_: Any) -> None:
    # A worker that prefetches holds messages another idle worker could run; Celery's default
    # is 4, a value the project set on purpose is kept.
    global booted_at
    booted_at = clock.now()
    if conf is not None and conf.worker_prefetch_multiplier == CELERY_DEFAULT_PREFETCH:
        conf.worker_prefetch_multiplier = 1


@signals.celeryd_after_setup.connect
def _note_queues(sender: Any = None, instance: Any = None, **_: Any) -> None:
    # The worker runs a run's next turn itself only when it consumes that run's queue.
    dispatch.install(dispatch.Transport(served_queues=set(instance.app.amqp.queues.consume_from)))


# Connected before durable's other task handlers (receivers run in the order they connect):
# they query through the connection this one checks.
@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_old_connection(task: Any = None, **_: Any) -> None:
    """Before and after each durable task, drop its connection if broken or past ``CONN_MAX_AGE``."""
    from . import connections

    if connections.concerns_durable(task):
        connections.close_if_unusable_or_obsolete(task)


@signals.task_prerun.connect
def _receive_trace(task: Any = None, **_: Any) -> None:
    """A durable task continues the trace its message carries (see ``durable.tracing``)."""
    if tracing.enabled() and task is not None and task.name.startswith("durable."):
        request = task.request
        task.request.durable_trace = tracing.received(
            {name: request.get(name) for name in tracing.HEADER_NAMES}
        )


@signals.task_postrun.connect
def _forget_trace(task: Any = None, **_: Any) -> None:
    token = getattr(task.request, "durable_trace", None) if task is not None else None
    if token is not None:
        tracing.forget(token)


@signals.worker_ready.connect
def _reclaim_predecessor(sender: Any = None, **_: Any) -> None:
    """A worker restarted under the same INSTANCE_ID takes its predecessor's leases back at once."""
    from django.db import connections

    from .engine import sweeps

    try:
        found = sweeps.reclaim(conf.get().INSTANCE_ID, booted_at)
        if found:
            log.warning(
                "durable: reclaimed %d run(s) left by a predecessor of %s", found, conf.get().INSTANCE_ID
            )
    except Exception:  # noqa: BLE001 - the orphan sweep recovers them later anyway
        log.warning("durable: could not reclaim leases at start-up", exc_info=True)
    finally:
        # Pool children forked later must not inherit this connection.
        connections.close_all()


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _hand_back_leases(**_: Any) -> None:
    """Release the leases of turns this process still runs, so another worker continues at once."""
    from .engine import leases
    from .models import Run

    settings = conf.get()
    for run_id, owner in list(leases.active.items()):
        try:
            queue = (
                Run.objects.using(settings.DATABASE).filter(id=run_id).values_list("queue", flat=True).first()
            )
            if Run.objects.using(settings.DATABASE).release(run_id, owner, clock.now(), clock.now()):
                dispatch.advance(run_id, queue or settings.DEFAULT_QUEUE)
        except Exception:  # noqa: BLE001 - the orphan sweep recovers it after the lease
            log.warning("durable: could not hand back the lease of run %s", run_id, exc_info=True)


@signals.task_prerun.connect
def _mark_task_step_started(task: Any = None, **_: Any) -> None:
    """A Celery task sent as a step carries a ``durable`` header: mark its attempt started."""
    where = getattr(getattr(task, "request", None), "durable", None)
    if not where:
        return
    from .models import Checkpoint

    run_id, seq, attempt, *token = where
    Checkpoint.objects.using(conf.get().DATABASE).begin(
        run_id, seq, attempt, token[0] if token else None, clock.now()
    )


@signals.worker_process_init.connect
def _pool_child(**_: Any) -> None:
    """A prefork pool child may end itself to free a turn stuck in a body (see engine.leases)."""
    from .engine import leases

    leases.may_exit = True
