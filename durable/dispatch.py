"""The one place that sends durable's Celery messages, always after the surrounding commit.

Messages are hints: a failed publish is logged and left to the sweeps. How this process reaches
workers is one ``Transport``: the test harness installs its own (see ``durable.testing``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.db import connections, transaction

from . import clock, codecs, conf, publish_behind, routing, tracing
from .definitions import registry

log = logging.getLogger("durable.dispatch")

ADVANCE = "durable.advance"
ADVANCE_BATCH = "durable.advance_batch"
RUN_STEP = "durable.run_step"
STEP_RESULT = "durable.step_result"
STEP_FAILED = "durable.step_failed"
APPLY_ENTITY = "durable.apply_entity"
PROBE = "durable.probe"


@dataclass(frozen=True)
class Message:
    task: str
    args: tuple[Any, ...]
    queue: str
    options: dict[str, Any] = field(default_factory=dict)


def celery_sender(message: Message) -> None:
    from celery import current_app

    # An empty queue lets Celery's own routing place the message (an existing task's queue).
    # JSON whatever the project's task_serializer says: durable's messages carry only ids and
    # JSON payloads, and a worker of another language must be able to read them.
    options = {"serializer": "json", **message.options}
    current_app.send_task(message.task, args=message.args, queue=message.queue or None, **options)


def celery_send_many(messages: list[Message]) -> None:
    """Publish ``messages`` through one producer, in kombu's publish batches where the broker
    has them (Redis: one pipeline per batch instead of a round trip per message). The messages
    are the ones ``celery_sender`` sends, one by one."""
    from celery import current_app

    with current_app.producer_or_acquire() as producer:
        batch = getattr(producer, "batch", None)  # kombu >= 5.7; older ones publish one by one
        with batch() if batch else contextlib.nullcontext():
            for message in messages:
                options = {"serializer": "json", **message.options}
                current_app.send_task(
                    message.task, args=message.args, queue=message.queue or None, producer=producer, **options
                )


#: A sender may offer a batch form of itself as its ``many`` attribute.
celery_sender.many = celery_send_many  # type: ignore[attr-defined]


#: What Celery raises inside a task that reached its soft time limit: a step's timeout.
SOFT_TIME_LIMIT_ERRORS: tuple[type[BaseException], ...] = (SoftTimeLimitExceeded,)


def time_limit() -> float | None:
    """Seconds of the Celery task running now before its first time limit, if it has one: that
    limit would also cut short whatever else the task runs (a next turn, a step run in place).
    The smallest of the message's limits, the task's own, and the worker's (its
    ``--time-limit`` / ``--soft-time-limit``, else the app's ``task_time_limit`` /
    ``task_soft_time_limit``): Celery applies the first of those that is set, so the smallest
    is never later than the one that ends the task."""
    from celery import current_task

    task = current_task._get_current_object()
    if task is None:
        return None
    hard, soft = task.request.timelimit or (None, None)
    worker = transport.worker_time_limits
    if worker is None:  # not a worker (a task applied in this process): the app's settings
        settings = task.app.conf
        worker = (settings.task_time_limit, settings.task_soft_time_limit)
    limits = (hard, soft, task.time_limit, task.soft_time_limit, *worker)
    return min((float(x) for x in limits if x), default=None)


@dataclass
class Transport:
    """How this process reaches workers, and which work it may do itself.

    Every process starts with the default one, which serves no queue (not a worker); a Celery
    worker installs its own at start-up (see ``durable.celery``), the test harness one per test.
    """

    #: Publishes one message; raises when the broker cannot take it (the sweeps re-send).
    send: Callable[[Message], None] = celery_sender
    #: Queues this process consumes: a run's next turn, or a step, runs here only for those.
    #: None means every queue (the test harness runs all messages); empty means not a worker.
    served_queues: set[str] | None = field(default_factory=set)
    #: Whether ``durable.result()`` may wait for a run to finish: not when nothing runs the
    #: run's messages meanwhile (the harness runs them only when the test asks).
    may_wait: bool = True
    #: Whether one thread per process renews its leases and holds (not under a frozen clock).
    keep_alive: bool = True
    #: Whether a first turn asked for outside a transaction leaves from this process's publishing
    #: thread, gathered with others (``publish_behind``): in a process that serves no queue.
    behind: bool = False
    #: A worker's own time limits (hard, soft), as Celery read them when it started: from
    #: ``--time-limit`` and ``--soft-time-limit``, else from the app's settings. Celery applies
    #: them to every task without its own, and never reads the settings again; None elsewhere.
    worker_time_limits: tuple[float | None, float | None] | None = None

    def serves(self, queue: str) -> bool:
        """Whether this process consumes ``queue``."""
        return self.served_queues is None or queue in self.served_queues


transport = Transport(behind=True)


def install(new: Transport) -> Transport:
    """Make ``new`` this process's transport; return the one it replaces. The first turns the
    publishing thread holds leave first, by the transport they were handed over under."""
    global transport
    flush()
    previous, transport = transport, new
    return previous


@contextlib.contextmanager
def using(new: Transport) -> Iterator[Transport]:
    """Use ``new`` as this process's transport inside the block."""
    previous = install(new)
    try:
        yield new
    finally:
        install(previous)


def _publish(message: Message) -> bool:
    """Send ``message``; False (logged) when it could not leave."""
    try:
        transport.send(message)
    except Exception:  # noqa: BLE001 - the sweeps re-drive whatever a lost message left
        log.warning(
            "durable: could not send %s%s; a sweep will retry", message.task, message.args, exc_info=True
        )
        return False
    return True


def _publish_many(messages: list[Message]) -> None:
    many = getattr(transport.send, "many", None)
    if many is None:
        for message in messages:
            _publish(message)
        return
    try:
        many(messages)
    except Exception:  # noqa: BLE001 - as one by one: what did not leave, the sweeps re-drive
        log.warning("durable: could not send %s message(s); a sweep will retry", len(messages), exc_info=True)


def send_after_commit(message: Message) -> None:
    # The trace context is the one current now: the commit may come after the span ended.
    message = traced(message)
    transaction.on_commit(lambda: _publish(message), using=conf.get().DATABASE)


def traced(message: Message) -> Message:
    """``message`` carrying the current span's trace context in its headers (W3C traceparent),
    so the worker that handles it continues the run's trace there."""
    carried = tracing.headers()
    if not carried:
        return message
    options = dict(message.options)
    options["headers"] = {**options.get("headers", {}), **carried}
    return Message(message.task, message.args, message.queue, options)


def _claims(queue: str, remote: set[str] | None = None) -> str:
    """The queue whose workers claim the turns of a run on ``queue``: for a remote workflow's,
    durable's own (a remote worker has no database to claim with; it gets ``durable.remote_turn``).
    ``remote``: the remote queues, when the caller already has them."""
    settings = conf.get()
    if remote is None:
        remote = _remote_queues()
    return routing.turn_queue(queue, remote, settings.DEFAULT_QUEUE) if remote else queue


def _remote_queues() -> set[str]:
    return set(conf.get().REMOTE_QUEUES) | registry.remote_turn_queues()


def advance(run_id: str, queue: str, *, behind: bool = False) -> None:
    """Ask a worker on ``queue`` to run the next turn of ``run_id``, after the commit. Wakes asked
    for back to back in one transaction (a loop of ``durable.start`` in ``atomic()``, say) leave
    together after it, shared out as ``advance_many`` shares a sweep's; ``behind``: from this
    process's publishing thread, once the commit has shared them out."""
    db = conf.get().DATABASE
    message = traced(Message(ADVANCE, (run_id,), _claims(queue)))
    if message.options:  # a traced wake leaves on its own, with its trace
        transaction.on_commit(lambda: _publish(message), using=db)
        return
    connection = connections[db]
    hooks = getattr(connection, "run_on_commit", None) if connection.in_atomic_block else None
    if hooks:
        savepoints, last, _ = hooks[-1]
        # Only under the same savepoints: a rolled-back savepoint drops its hooks, and with
        # them its wakes, as it drops its runs.
        if isinstance(last, _Wakes) and last.behind == behind and savepoints == set(connection.savepoint_ids):
            last.messages.append(message)
            return
    transaction.on_commit(_Wakes([message], behind), using=db)


def first_turn(run_id: str, queue: str) -> None:
    """Ask for the first turn of ``run_id``, just created: as ``advance`` does, except that a
    process serving no queue hands it to its publishing thread (``publish_behind``): at once
    outside a transaction, at the commit inside one. Only a first turn goes there: the run's
    ``wake_at`` backs it up."""
    settings = conf.get()
    connection = connections[settings.DATABASE]
    # A traced wake leaves on its own, with its trace.
    if not (transport.behind and settings.PUBLISH_IN_THREAD) or tracing.headers():
        advance(run_id, queue)
    elif connection.in_atomic_block:
        advance(run_id, queue, behind=True)
    elif connection.get_autocommit():
        _behind.put(_claims(queue), run_id)
    else:
        advance(run_id, queue)


class _Wakes:
    """The on-commit hook of wakes asked for one after another in a transaction; ``behind``:
    handed to the publishing thread once shared out."""

    __slots__ = ("behind", "messages")

    def __init__(self, messages: list[Message], behind: bool = False) -> None:
        self.messages, self.behind = messages, behind

    def __call__(self) -> None:
        shared = (
            self.messages
            if len(self.messages) == 1
            else _wake_messages((message.queue, message.args[0]) for message in self.messages)
        )
        if self.behind:
            _behind.put_ready(shared)
        elif len(shared) == 1:
            _publish(shared[0])
        else:
            _publish_many(shared)


def _publish_lots(items: list[publish_behind.Item]) -> None:
    """Send what a publishing thread gathered (``publish_behind``): wakes in its lots, and the
    messages a commit shared out as they are."""
    wakes = [item for item in items if isinstance(item, tuple)]
    ready = [item for item in items if isinstance(item, Message)]
    _publish_many(_wake_messages(wakes, publish_behind.lots) + ready)


def _carry_app() -> Callable[[], None]:
    """What makes the caller's Celery app current in the publishing thread too."""
    from celery import current_app

    return current_app._get_current_object().set_current


_behind = publish_behind.publisher(_publish_lots, _carry_app)


def hurry() -> None:
    """A caller is about to wait for a run: send the first turns this process holds now."""
    _behind.hurry()


def flush(timeout: float | None = 10.0) -> bool:
    """Wait until the first turns handed to this process's publishing thread have left (or
    failed to); False if some were still held after ``timeout`` seconds."""
    return _behind.flush(timeout)


REMOTE_TURN = "durable.remote_turn"


def remote_turn(message: dict[str, Any], queue: str) -> None:
    """Send one turn to the remote workers of ``queue`` (protocol v1, ``turn.json``), as the
    keyword argument ``turn``."""
    send_after_commit(Message(REMOTE_TURN, (), queue, {"kwargs": {"turn": message}}))


DECISION = "durable.decision"
TURN_HEARTBEAT = "durable.turn_heartbeat"


def decision(message: dict[str, Any], reply_to: str) -> None:
    """Send a remote turn's decision (``decision.json``) now, as keyword arguments."""
    _publish(Message(DECISION, (), reply_to, {"kwargs": message}))


def turn_heartbeat(run_id: str, turn: str, reply_to: str) -> None:
    """Send a remote turn's heartbeat now: it keeps the turn's lease (``turn_heartbeat.json``)."""
    _publish(Message(TURN_HEARTBEAT, (), reply_to, {"kwargs": {"run_id": run_id, "turn": turn}}))


def advance_at(run_id: str, queue: str, due: datetime) -> None:
    """A hint, for a timer due within ``TIMER_HINT_WITHIN``: a turn of ``run_id`` when it falls
    due, without waiting for the timer sweep's next pass (or for beat at all). A countdown lives
    in worker memory, so only a near one is sent: the run's ``wake_at`` stays the real timer, and
    the sweep its safety net."""
    # A little late rather than early: a turn before the timer is due only waits again.
    seconds = (due - clock.now()).total_seconds() + 0.05
    if 0 < seconds <= conf.get().TIMER_HINT_WITHIN.total_seconds():
        send_after_commit(Message(ADVANCE, (run_id,), _claims(queue), {"countdown": round(seconds, 3)}))


#: Runs one ``durable.advance_batch`` message carries at most. Building and publishing a Celery
#: message costs 0.3-0.6 ms, a sweep's SQL about 0.02 ms a run: dozens of runs a message make
#: publishing a small part of a sweep, and a worker process holds a message for 50 turns at
#: most, not for a whole backlog.
WAKE_BATCH = 50
#: Fewest messages a wake of many runs on one queue is split into (when it has that many runs),
#: so the turns still spread over every process of a few workers instead of queueing behind
#: one message in one of them.
WAKE_SPREAD = 16


def advance_many(runs: Iterable[tuple[str, str]]) -> None:
    """Ask for the next turn of each ``(run_id, queue)``, published together after the commit (a
    sweep wakes hundreds of runs at once). Per queue the runs are shared out over
    max(⌈n / WAKE_BATCH⌉, min(n, WAKE_SPREAD)) messages: a share of one run leaves as
    ``durable.advance``, a larger one as ``durable.advance_batch``."""
    remote = _remote_queues()  # once for the batch
    messages = _wake_messages((_claims(queue, remote), run_id) for run_id, queue in runs)
    if messages:
        transaction.on_commit(lambda: _publish_many(messages), using=conf.get().DATABASE)


def _wake_messages(
    claims: Iterable[tuple[str, str]], share_out: Callable[[list[str]], list[list[str]]] | None = None
) -> list[Message]:
    """The messages asking for the turns of ``(claiming queue, run_id)``, shared out per queue by
    ``share_out`` (``shares`` unless given)."""
    by_queue: dict[str, list[str]] = {}
    for queue, run_id in claims:
        by_queue.setdefault(queue, []).append(run_id)
    return [
        Message(ADVANCE, (share[0],), queue) if len(share) == 1 else Message(ADVANCE_BATCH, (share,), queue)
        for queue, run_ids in by_queue.items()
        for share in (share_out or shares)(run_ids)
    ]


def shares(run_ids: list[str]) -> list[list[str]]:
    """``run_ids`` cut, in order, into max(⌈n / WAKE_BATCH⌉, min(n, WAKE_SPREAD)) runs of
    lengths that differ by one at most."""
    n = len(run_ids)
    count = max(-(-n // WAKE_BATCH), min(n, WAKE_SPREAD))
    size, longer = divmod(n, count) if n else (0, 0)
    out, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < longer else 0)
        out.append(run_ids[start:end])
        start = end
    return out


def woken(message: Message) -> list[str]:
    """The runs whose turn ``message`` asks for: none unless it is a wake."""
    if message.task == ADVANCE:
        return [message.args[0]]
    if message.task == ADVANCE_BATCH:
        return list(message.args[0])
    return []


def run_step(
    run_id: str,
    seq: int,
    attempt: int,
    token: str | None,
    queue: str,
) -> None:
    """Ask a worker on ``queue`` to run one step attempt; only a message with the attempt's token
    may start it. The step's ``timeout`` is enforced by the worker's durable (``timelimits``), not
    sent as a Celery time limit, which would also cut short the next turn run after it."""
    send_after_commit(Message(RUN_STEP, (run_id, seq, attempt, token), queue))


def celery_task(
    run_id: str,
    seq: int,
    attempt: int,
    token: str | None,
    name: str,
    payload: dict[str, Any],
    queue: str,
    result_queue: str,
    *,
    timeout: timedelta | None = None,
    grace: timedelta = timedelta(0),
) -> None:
    """Send an existing Celery task, or a remote step, under its own name with its arguments; its
    result comes back through ``durable.step_result``, which records it only with the attempt's
    token. The worker that runs it needs nothing of durable: Celery itself sends the ``link`` on
    success and the ``link_error`` on failure (see ``durable.step_failed``); a worker that is not
    a Celery one reads the ``durable_attempt`` header (protocol v1) and replies itself.

    Under a codec each argument of a remote step leaves sealed as the rows hold it; a Celery
    task used as a step never gets this far then (see ``Limits.sealed_payloads``)."""
    from celery import signature

    codec = conf.codec() if payload.get("remote") else None
    args = [codecs.sealed(arg, codec) for arg in payload.get("args", [])]
    kwargs = {name: codecs.sealed(value, codec) for name, value in payload.get("kwargs", {}).items()}
    where = {"run_id": run_id, "seq": seq, "attempt": attempt, "token": token}
    options: dict[str, Any] = {
        "kwargs": kwargs,
        "link": signature(STEP_RESULT, kwargs=where, queue=result_queue),
        "link_error": signature(STEP_FAILED, kwargs=where, queue=result_queue),
        "headers": {
            # Lets a worker that has durable installed mark the attempt started (see durable.celery).
            "durable": [run_id, seq, attempt, token],
            "durable_attempt": attempt_header(run_id, seq, attempt, token, result_queue, timeout),
        },
    }
    if timeout is not None:
        options["soft_time_limit"] = timeout.total_seconds()
        options["time_limit"] = (timeout + grace).total_seconds()
    send_after_commit(Message(name, tuple(args), queue, options))


#: The version of the messages exchanged with workers that may not run durable (durable/protocol/).
PROTOCOL = 1


def attempt_header(
    run_id: str, seq: int, attempt: int, token: str | None, reply_to: str, timeout: timedelta | None
) -> dict[str, Any]:
    """What a worker needs to report on an attempt: whom to send ``durable.step_result`` and
    ``durable.heartbeat`` to, with which arguments (protocol v1, ``attempt.json``)."""
    return {
        "protocol": PROTOCOL,
        "run_id": run_id,
        "seq": seq,
        "attempt": attempt,
        "token": token,
        "reply_to": reply_to,
        "timeout": timeout.total_seconds() if timeout is not None else None,
    }


HEARTBEAT = "durable.heartbeat"


def attempt_of(request: Any) -> dict[str, Any] | None:
    """The ``durable_attempt`` header of a Celery task's request, if durable sent it as a step
    (a worker puts a message's headers on the request; an eager ``apply()`` keeps them apart)."""
    where = getattr(request, "durable_attempt", None) or (getattr(request, "headers", None) or {}).get(
        "durable_attempt"
    )
    return where if isinstance(where, dict) and where.get("reply_to") else None


def heartbeat_from(attempt: dict[str, Any], progress: Any) -> None:
    """Send ``durable.heartbeat`` for the attempt a ``durable_attempt`` header names, now (a
    beat belongs to no transaction), to the queue it names (protocol v1, ``heartbeat.json``);
    its progress sealed under the codec, if one is set."""
    report = {key: attempt.get(key) for key in ("run_id", "seq", "attempt", "token")}
    progress = None if progress is None else codecs.sealed(progress, conf.codec())
    # When sent: the progress kept is the last beat's sent, whatever order they are taken in.
    beat = {**report, "progress": progress, "sent_at": time.time()}
    _publish(Message(HEARTBEAT, (), attempt.get("reply_to") or "", {"kwargs": beat}))


def step_result_from(attempt: dict[str, Any], error: dict[str, Any]) -> None:
    """Send ``durable.step_result`` with ``error`` for the attempt a ``durable_attempt`` header
    names, now, to the queue it names (protocol v1, ``step_result.json``)."""
    report = {key: attempt.get(key) for key in ("run_id", "seq", "attempt", "token")}
    _publish(Message(STEP_RESULT, (), attempt["reply_to"], {"kwargs": {**report, "error": error}}))


def reported_failure(task_id: str) -> dict[str, Any] | None:
    """The error a failed Celery task left in this app's result backend, if it shares one with
    the worker that ran it; None otherwise (no backend, not there, or unreadable)."""
    from celery import current_app
    from celery.backends.base import DisabledBackend

    from .errors import error_dict

    backend = current_app.backend
    if isinstance(backend, DisabledBackend):
        return None
    try:
        meta = backend.get_task_meta(task_id)
    except Exception:  # noqa: BLE001 - a backend that cannot answer: the generic error stands
        log.info(
            "durable: could not read the failure of task %s from the result backend", task_id, exc_info=True
        )
        return None
    exc = meta.get("result") if meta.get("status") == "FAILURE" else None
    if not isinstance(exc, BaseException):
        return None
    return {**error_dict(exc), "details": {"task_id": task_id}}


def apply_entity(
    name: str,
    key: str,
    queue: str,
    *,
    claim: Callable[[], bool] | None = None,
    unclaim: Callable[[], None] | None = None,
) -> None:
    """Ask a worker on ``queue`` to apply the pending ops of entity (``name``, ``key``).

    With ``claim``, called after the commit: the message leaves only if it returns True (False:
    a prompt already on its way covers this commit); ``unclaim`` undoes it if the send fails."""
    message = Message(APPLY_ENTITY, (name, key), queue)
    if claim is None:
        send_after_commit(message)
        return

    def prompt() -> None:
        try:
            claimed = claim()
        except Exception:  # noqa: BLE001 - unclaimed, the prompt leaves: one too many is harmless
            log.warning("durable: could not note the prompt of entity %s:%s", name, key, exc_info=True)
            claimed = True
        if claimed and not _publish(message) and unclaim is not None:
            # Lost claim or not, the entity sweep prompts the key's waiting ops and expires it.
            with contextlib.suppress(Exception):
                unclaim()

    transaction.on_commit(prompt, using=conf.get().DATABASE)


def probe(queue: str, sent_at: str) -> None:
    """Send a probe down ``queue``: the worker that takes it has the step attempts sent down
    ``queue`` before it and still not taken sent again (see ``engine.redispatch``)."""
    _publish(Message(PROBE, (queue, sent_at), queue))


def sweep(task: str, queue: str) -> None:
    _publish(Message(task, (), queue))
