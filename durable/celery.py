"""Celery wiring: the sweeps' beat schedule, a worker's start-up and shutdown."""

from __future__ import annotations

import gc
import logging
import sys
from typing import Any

from celery import signals

from . import clock, conf, dispatch, redis_restarts, routing, shutdown, tracing
from .replay import stepscope

log = logging.getLogger("durable.celery")

CELERY_DEFAULT_PREFETCH = 4

#: When this worker process started: leases its instance id holds that were not renewed since
#: belong to a predecessor.
booted_at = clock.now()
#: This worker's Celery node name, once set up.
node_name: str | None = None


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


class QuietSweeps(logging.Filter):
    """Demote to DEBUG Celery's INFO lines about durable's sweeps (beat sending one, a worker
    receiving one, one that did nothing succeeding): on an idle system they were hundreds of
    lines a minute. A sweep that did something still logs its success at INFO."""

    LOGGERS = ("celery.beat", "celery.worker.strategy", "celery.app.trace")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not self._idle_sweep(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    @staticmethod
    def _idle_sweep(record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        if isinstance(data, dict):
            name = str(data.get("name") or "")
            # No return value yet: the message was just received.
            return name.startswith("durable.sweep_") and str(data.get("return_value", "0")) == "0"
        args = record.args if isinstance(record.args, tuple) else ()
        return record.name == "celery.beat" and any(str(a).startswith("durable.sweep_") for a in args)

    @classmethod
    def install(cls) -> None:
        for name in cls.LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, cls) for f in logger.filters):
                logger.addFilter(cls())


@signals.beat_init.connect
def _add_sweeps(sender: Any = None, **_: Any) -> None:
    QuietSweeps.install()
    # Entries the project defined itself (same key) win.
    scheduler = sender.scheduler
    missing = {k: v for k, v in beat_schedule().items() if k not in scheduler.schedule}
    if missing:
        scheduler.update_from_dict(missing)


@signals.celeryd_init.connect
def _booted(**_: Any) -> None:
    global booted_at
    booted_at = clock.now()
    redis_restarts.guard()


@signals.celeryd_after_setup.connect
def _prefetch_one(instance: Any = None, **_: Any) -> None:
    # A worker that prefetches holds messages another idle worker could run; Celery's default
    # is 4, a value the project set on purpose is kept.
    if instance is None:
        return
    if _green():
        _prefetch_for_green_pool(instance)
    elif instance.prefetch_multiplier == CELERY_DEFAULT_PREFETCH:
        _set_prefetch(instance, 1)


def _set_prefetch(worker: Any, multiplier: int) -> None:
    # On the worker and its consumer: the command line read the setting before any signal, and
    # the consumer was built with it; its prefetch count is set when it starts consuming, after.
    worker.prefetch_multiplier = multiplier
    consumer = getattr(worker, "consumer", None)
    if consumer is not None and consumer.initial_prefetch_count:
        consumer.prefetch_multiplier = multiplier
        consumer.initial_prefetch_count = max(worker.max_concurrency or worker.concurrency, 1) * multiplier


def _prefetch_for_green_pool(worker: Any) -> None:
    # A green pool's blocking loop asks the broker for more only at the start of each of its
    # 2-second polls: holding one message per greenlet, it takes `concurrency` messages every
    # 2 seconds, and a backlog of sweeps hides a run's turns for as long as they take to expire.
    if worker.prefetch_multiplier == 1:
        log.warning(
            "durable: worker_prefetch_multiplier=1 starves a gevent or eventlet pool (it takes "
            "`concurrency` messages every 2 seconds); this worker uses Celery's default of %s",
            CELERY_DEFAULT_PREFETCH,
        )
        _set_prefetch(worker, CELERY_DEFAULT_PREFETCH)


def _green() -> bool:
    """Whether this process runs a green pool (gevent or eventlet): Celery's command line
    patches the standard library for it before any worker signal is sent."""
    from kombu.utils.compat import _detect_environment

    return _detect_environment() in ("gevent", "eventlet")


@signals.celeryd_after_setup.connect
def _note_queues(sender: Any = None, instance: Any = None, **_: Any) -> None:
    # The worker runs a run's next turn itself only when it consumes that run's queue.
    served = set(instance.app.amqp.queues.consume_from)
    # Its own time limits as it read them: command-line flags never reach the app's settings.
    limits = (getattr(instance, "time_limit", None), getattr(instance, "soft_time_limit", None))
    dispatch.install(dispatch.Transport(served_queues=served, worker_time_limits=limits))
    global node_name
    node_name = str(getattr(instance, "hostname", None) or sender or "worker")
    QuietSweeps.install()
    default = routing.queue_in(conf.get().DEFAULT_QUEUE, conf.get().NAMESPACE)
    if default not in served:
        log.warning(
            "durable: this worker does not consume %r, the queue of durable's turns and sweeps "
            "(it consumes %s): runs stay pending unless another worker does; start it with "
            "-Q %s or add the queue",
            default,
            ", ".join(sorted(served)) or "nothing",
            ",".join(sorted({default, *served})),
        )


# Connected before durable's other task handlers (receivers run in the order they connect):
# they query through the connection this one checks.
@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_old_connection(task: Any = None, signal: Any = None, **_: Any) -> None:
    """Before and after each durable task, drop its connection if broken or past ``CONN_MAX_AGE``."""
    from . import connections

    if connections.concerns_durable(task):
        connections.close_if_unusable_or_obsolete(task, starting=signal is signals.task_prerun)


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
    """A worker restarted under the same INSTANCE_ID takes its predecessor's leases back at once,
    and any starting worker sends a turn to the parked runs of the workflows it registered."""
    from django.db import connections

    from . import metrics
    from .engine import blocked, leases, presence, sweeps

    metrics.make()  # the project's SDK provider is set by now (its gauges, before any run)
    try:
        # Noted here, in the worker's main process; its keeper thread renews the note.
        presence.announce(node_name or "worker", sorted(dispatch.transport.served_queues or ()))
        leases.keep()
    except Exception:  # noqa: BLE001 - the health page only shows this worker late
        log.warning("durable: could not note this worker in the database", exc_info=True)
    try:
        found = sweeps.reclaim(conf.get().INSTANCE_ID, booted_at)
        if found:
            log.warning(
                "durable: reclaimed %d run(s) left by a predecessor of %s", found, conf.get().INSTANCE_ID
            )
    except Exception:  # noqa: BLE001 - the orphan sweep recovers them later anyway
        log.warning("durable: could not reclaim leases at start-up", exc_info=True)
    try:
        # This worker may carry the fix for runs parked by non-determinism: try them now.
        blocked.resume_registered(conf.get())
    except Exception:  # noqa: BLE001 - their backoff timers bring them back anyway
        log.warning("durable: could not resume runs parked by non-determinism", exc_info=True)
    finally:
        # Pool children forked later must not inherit this connection.
        connections.close_all()


@signals.celeryd_after_setup.connect
def _detach_async_steps(**_: Any) -> None:
    # A green pool's threads are greenlets, which cannot host the async steps' loop alongside:
    # there an async step's task waits for it, one attempt per greenlet.
    from .engine import asyncattempts

    asyncattempts.detached = not _green()


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _finish_async_steps(**_: Any) -> None:
    """A warm shutdown lets this process's async attempts in flight end (up to a LEASE): their
    messages were acknowledged already; one cut short is run again once its hold lapses."""
    from .engine import asyncattempts

    asyncattempts.drain(conf.get().LEASE.total_seconds())


@signals.worker_shutting_down.connect
def _leaving(**_: Any) -> None:
    # Sent from the main process's signal handler: the keeper thread does the work.
    from .engine import presence

    presence.leaving()


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _hand_back_leases(**_: Any) -> None:
    """Release the leases of turns this process still runs, so another worker continues at once,
    and take the worker off the health page."""
    from .engine import leases, presence
    from .metrics import shared

    leases.leave()
    try:
        presence.leave()
    except Exception:  # noqa: BLE001 - its row then ages out as a killed worker's does
        log.warning("durable: could not take this worker off the health page", exc_info=True)
    shared.flush()  # the last second's metrics, before the process ends


def _worker_leaving(exc: BaseException) -> bool:
    """Whether ``exc`` is this worker's shutdown raised inside a turn or a step (durable.shutdown)."""
    from celery.exceptions import WorkerShutdown, WorkerTerminate
    from celery.worker import state

    if isinstance(exc, (WorkerShutdown, WorkerTerminate)) or state.should_terminate:
        # A cold shutdown raises from its signal handler into whatever runs (the solo pool:
        # NotImplementedError from kill_job): anything raised from then on is the shutdown's.
        return True
    greenlet = sys.modules.get("greenlet")
    if greenlet is not None and isinstance(exc, greenlet.GreenletExit):
        return True  # gevent kills the greenlets still running when its pool stops
    # A prefork child told to end (SIGTERM from its pool or a whole process group, as systemd
    # stops a unit) exits through billiard's handler, which notes it before raising SystemExit.
    billiard = sys.modules.get("billiard.common")
    told = getattr(billiard, "_should_have_exited", None) if billiard is not None else None
    return isinstance(exc, SystemExit) and bool(told and told[0])


shutdown.recognise(_worker_leaving)


@signals.task_prerun.connect
def _mark_task_step_started(task: Any = None, **_: Any) -> None:
    """A Celery task sent as a step carries a ``durable`` header: mark its attempt started."""
    where = getattr(getattr(task, "request", None), "durable", None)
    if not where:
        return
    from django.db import DatabaseError

    from .models import Checkpoint

    run_id, seq, attempt, *token = where
    if not token or not token[0]:
        log.warning(
            "durable: a task message for %s#%s attempt %s carries no token: not marked started",
            run_id,
            seq,
            attempt,
        )
        return
    try:
        Checkpoint.objects.using(conf.get().DATABASE).begin(run_id, seq, attempt, token[0], clock.now())
    except DatabaseError:
        # A remote worker with durable installed may have no database: its beats say it started.
        log.info("durable: could not mark %s#%s attempt %s started here", run_id, seq, attempt)


@signals.worker_init.connect
def _freeze_startup_heap(**_: Any) -> None:
    """What the worker built so far stays for its life: each full collection walked all of it,
    and in a prefork child, touching it copied every page the child shared with its parent."""
    if conf.get().FREEZE_GC_AT_START:
        gc.collect()  # before the fork: what is garbage now is not frozen with the rest
        gc.freeze()


@signals.worker_init.connect
def _serve_remote_steps(sender: Any = None, **_: Any) -> None:
    """Run the remote steps this worker knows as Celery tasks (for the queues it consumes)."""
    from . import remote

    served = remote.serve(sender.app)
    if served:
        log.info("durable: remote steps served as Celery tasks: %s", ", ".join(served))


def _beat_by_message(progress: Any) -> None:
    """``durable.heartbeat()`` inside a Celery task durable sent as a step: a message."""
    from celery import current_task

    where = dispatch.attempt_of(getattr(current_task, "request", None))
    if where is not None:
        dispatch.heartbeat_from(where, progress)


stepscope.beat_elsewhere = _beat_by_message


@signals.worker_process_init.connect
def _pool_child(**_: Any) -> None:
    """A prefork pool child may end itself to free a turn stuck in a body (see engine.leases)."""
    from . import metrics
    from .engine import leases

    leases.may_exit = True
    metrics.make()  # a provider set by the project's own worker_process_init
    if conf.get().FREEZE_GC_AT_START:
        # What the pool built in the parent after worker_init too; no collection first, which
        # would touch (and so copy) every page shared with the parent.
        gc.freeze()
