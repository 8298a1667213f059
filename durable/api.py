"""Start and steer runs from views, shells and tasks.

Every call writes in the caller's transaction; the Celery messages it causes go out on commit.
This module checks what a caller passes and hands the work to ``durable.engine``, imported when
called: importing durable must not import its models before Django is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from . import conf, guards, results
from .calls import name_of, payload_of, run_id_of
from .definitions import Workflow
from .durations import parse_duration
from .errors import InvalidInput, cancelled_error
from .results import result

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .models import Run

from .replay.streams import checked_key
from .values import encode


class RunHandle:
    """A reference to a run, returned by ``start``; ``astatus``, ``aresult``, ``asignal`` and
    ``acancel`` are the awaitable twins for async code (see ``durable.api_async``)."""

    def __init__(self, run_id: str) -> None:
        self.id = run_id

    def status(self) -> str:
        return str(get_run(self.id).status)

    def result(self, timeout: Any = None) -> Any:
        return result(self.id, timeout=timeout)

    def signal(self, name: str, payload: Any = None, *, idempotency_key: str | None = None) -> None:
        signal(self.id, name, payload, idempotency_key=idempotency_key)

    def cancel(self, **kwargs: Any) -> bool:
        return cancel(self.id, **kwargs)

    async def astatus(self) -> str:
        return str((await sync_to_async(get_run)(self.id)).status)

    async def aresult(self, timeout: Any = None) -> Any:
        return await results.aresult(self.id, timeout=timeout)

    async def asignal(self, name: str, payload: Any = None, *, idempotency_key: str | None = None) -> None:
        await sync_to_async(signal)(self.id, name, payload, idempotency_key=idempotency_key)

    async def acancel(self, **kwargs: Any) -> bool:
        return await sync_to_async(cancel)(self.id, **kwargs)

    def __repr__(self) -> str:
        return f"<RunHandle {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


def start(
    workflow: Workflow | str,
    input: Any = None,
    *,
    run_id: str | None = None,
    version: str | None = None,
    namespace: str | None = None,
    tags: Any = (),
    delay: Any = None,
    search_attributes: dict[str, Any] | None = None,
    lane: Any = None,
    priority: int = 0,
) -> RunHandle:
    """Create a run (or return the existing one with this ``run_id``); its first turn is sent on
    commit. ``search_attributes`` are its first ones, checked by ``search_attributes_schema``.

    ``lane``: a ``durable.Lane`` the run waits in when its workflow declares no line of its own
    (``lane=``, ``singleton=``, ``concurrency=``). ``priority``: its place among the runs waiting
    in its line, higher first (then start order); a run that waits for nothing starts at once.

    Without ``run_id`` the run gets a time-ordered id (a version 7 UUID in 32 hex digits): a run
    started later sorts later, which keeps the rows of runs started together together. The id
    shows when the run started; pass your own ``run_id`` for one that shows nothing."""
    from .engine import runs

    if run_id is not None:
        run_id_of(run_id, reserved_ok=False)
    return RunHandle(
        runs.start(
            workflow,
            input,
            run_id=run_id,
            version=version,
            namespace=namespace,
            tags=tags,
            delay=delay,
            search_attributes=search_attributes,
            lane=lane,
            priority=priority,
        )
    )


def get_run(run_id: str) -> Run:
    """Return the run row, or raise RunNotFound."""
    from .engine import runs

    return runs.read_run(run_id_of(run_id))


def signal(run_id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None) -> None:
    """Deliver ``payload`` to the run's wait for ``name``, or keep it until the run waits. The
    same ``idempotency_key`` again for that run is dropped (signals and updates share the keys)."""
    from .api_updates import idempotency_key_of
    from .engine import runs

    stored = _signal_payload(name, payload)
    key = idempotency_key_of(idempotency_key)
    runs.deliver(run_id_of(run_id), name, stored, idempotency_key=key)


def signal_with_start(
    workflow: Workflow | str, input: Any = None, *, run_id: str, signal: str, payload: Any = None
) -> RunHandle:
    """Start run ``run_id`` unless it exists, then send it ``signal``, in one transaction: a
    concurrent start of the same id is the same run, and every signal sent this way is kept."""
    if run_id is None:
        raise InvalidInput("signal_with_start() needs the run_id of the run to start or signal")
    from .engine import runs

    run_id_of(run_id, reserved_ok=False)
    stored = _signal_payload(signal, payload)
    return RunHandle(runs.signal_with_start(workflow, input, run_id=run_id, signal=signal, payload=stored))


def publish_event(name: str, payload: Any = None) -> None:
    """Publish an event: every run waiting for ``name`` whose match the payload fits receives it,
    and it is kept for EVENT_BUFFER_TTL for waits that come later (each run gets it at most once)."""
    from .engine import events

    name_of(name, "event name", "Event")
    events.publish(name, payload_of(payload, f"the payload of event {name!r}"))


def _signal_payload(name: Any, payload: Any) -> Any:
    name_of(name, "signal name", "Signal")
    return payload_of(payload, f"the payload of signal {name!r}")


def complete_step(token: str, output: Any = None, *, error: Any = None) -> None:
    """Settle the step attempt that raised ``durable.CompleteLater`` after handing out ``token``
    (``durable.step_info().token``): with ``output``, or failed with ``error`` (an exception, an
    error dict or a message) under the step's retry policy. A wrong or forged token raises
    ``InvalidInput``; one whose attempt was settled already raises ``DurableError``
    (code ``already_settled``). Either way nothing changes."""
    from .engine import results_by_message

    # Tagged here, as a step's own return is: a completion sent as a message arrives tagged.
    results_by_message.complete_step(
        token, encode(output, what="the output passed to complete_step()"), error
    )


def heartbeat_step(token: str, progress: Any = None) -> bool:
    """Beat for the step attempt that raised ``durable.CompleteLater`` after handing out
    ``token``, from whatever now does its work: its ``heartbeat_timeout`` counts from this beat,
    and ``progress`` (when given) is kept as ``durable.heartbeat(progress)`` keeps it. False,
    changing nothing, once the attempt was completed or its run cancelled with ``interrupt=True``
    (stop the work); ``InvalidInput`` for a token that names no open attempt: forged, or its
    attempt failed (a timeout) and the position moved on."""
    from .engine import results_by_message

    return results_by_message.heartbeat_step(
        token, encode(progress, what="the progress passed to heartbeat_step()")
    )


def cancel(
    run_id: str, *, compensate: bool = False, reason: str | None = None, interrupt: bool = False
) -> bool:
    """Cancel an unfinished run; False if it had already finished.

    With ``interrupt``, ``durable.Cancelled`` is raised in the body at its current wait (its
    except/finally may run steps) and its running steps see ``durable.StepCancelled`` at their
    next heartbeat; with ``compensate`` too, the saga unwinds once the body lets it escape."""
    settings = conf.get()
    run_id_of(run_id)
    for option, value in (("compensate", compensate), ("interrupt", interrupt)):
        if not isinstance(value, bool):
            raise guards.refuse(option, f"must be True or False, got {guards.shown(value)}")
    guards.free_text(reason, "reason", max_bytes=settings.MAX_PAYLOAD_BYTES)
    error = cancelled_error(reason)
    from .engine import lifecycle

    return lifecycle.cancel(run_id, error, compensate=compensate, reason=reason, interrupt=interrupt)


def retry(run_id: str) -> RunHandle:
    """Run a failed, dead or cancelled run again from its history, the failures that ended it anew."""
    from .engine import runs

    runs.retry(run_id_of(run_id))
    return RunHandle(run_id)


def debounce(
    workflow: Workflow | str, input: Any = None, *, key: str, period: Any, max_wait: Any = None
) -> RunHandle:
    """Start one run of ``workflow`` per burst of calls for ``key``: it starts once ``period``
    passed without another call (``max_wait`` after the burst's first call at the latest), with
    the input of the last call. Every call of a burst returns the same run; a call after that run
    started begins the next burst. The run waits pending until then (the admin shows it, with the
    key); it starts within TIMER_SWEEP_INTERVAL of its time. Not yet for workflows with a line
    of their own (``singleton=``, ``concurrency=``, ``lane=``)."""
    from .engine import debounce

    return RunHandle(debounce.debounce(workflow, input, key=key, period=period, max_wait=max_wait))


def write_stream(key: str, value: Any) -> None:
    """Inside a step: append ``value`` to the stream ``key`` of the step's run, for
    ``read_stream``. Each write is stored once per attempt, in order (a retried step's attempt
    writes its values again); refused once the body closed the stream. In an ``async def``
    step, ``await durable.awrite_stream(...)``."""
    from .engine import streams

    checked = checked_key(key, "durable.write_stream()")
    streams.write_from_step(checked, payload_of(value, f"the value written to stream {checked!r}"))


def read_stream(run_id: str, key: str, *, timeout: Any = None) -> Iterator[Any]:
    """The values of the run's stream ``key`` in the order written, from the first, waiting for
    more until the body closes the stream or the run ends; ``WaitTimeout`` when no value came for
    ``timeout``. A generator: a sync view can stream it (``StreamingHttpResponse``)."""
    from .engine import runs, streams

    checked = checked_key(key, "durable.read_stream()")
    runs.get_run(run_id_of(run_id))  # RunNotFound now, not at the first value
    limit = None if timeout is None else parse_duration(timeout, what="timeout").total_seconds()
    return streams.read(run_id, checked, limit)


def fork(origin: str, /, *, at: int, version: str | None = None, **new: Any) -> RunHandle:
    """Start a new run of ``origin``'s workflow and input whose history before position ``at`` is
    a copy of ``origin``'s: its body replays those positions and runs on from ``at``.

    Called as API.md writes it, ``fork(run_id, at=7, run_id="fix-1", version=None)``: the first
    argument (positional only) is the run forked; ``run_id=`` the fork's own id (a fork with that
    id already is returned as it is). ``version``: the workflow version to run it on (default the
    origin's). Positions before ``at`` must be settled."""
    from .engine import forks

    unknown = sorted(set(new) - {"run_id"})
    if unknown:
        raise TypeError(f"fork() got an unexpected keyword argument {unknown[0]!r}")
    return RunHandle(forks.fork(run_id_of(origin), at, run_id=new.get("run_id"), version=version))


def delete_run(run_id: str) -> int:
    """Delete the run and its child subtree; return how many runs were deleted."""
    from .engine import runs

    return runs.delete(run_id_of(run_id))


Workflow.starter = start
