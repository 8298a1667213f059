"""OpenTelemetry spans for runs, turns and step attempts, when ``opentelemetry-api`` is installed.

Every span of a run belongs to one trace whose id is derived from the run id, so turns driven by
a sweep (a message with no trace headers) land in the run's trace too. Within it, the context
travels in Celery message headers: ``start()`` → the turn → the step attempt → the next turn.
The span of ``start()`` links to the caller's span (a request, a task) when there is one.
Without the package, or without a tracer provider configured, every function here is a cheap
no-op.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

try:  # optional: durable never requires OpenTelemetry
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised only where the package is absent
    trace = None  # type: ignore[assignment]

#: The trace headers of the Celery message the current task came with (set by durable.celery).
_received: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "durable_trace_headers", default=None
)
#: The header names a propagator writes (W3C: traceparent, tracestate).
HEADER_NAMES = ("traceparent", "tracestate")


def enabled() -> bool:
    """Whether spans are recorded: the API is installed and a tracer provider configured. The
    API's default provider records nothing, and building its spans would cost every turn."""
    return trace is not None and not isinstance(
        _provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    )


def _provider() -> Any:
    return trace.get_tracer_provider()


def _ids(run_id: str) -> tuple[int, int]:
    digest = hashlib.sha256(f"durable-run:{run_id}".encode()).digest()
    # Neither id may be zero (an invalid id in W3C trace context).
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def trace_id(run_id: str) -> int:
    """The id of the trace that holds every span of ``run_id``."""
    return _ids(run_id)[0]


def _run_root(run_id: str) -> Any:
    tid, sid = _ids(run_id)
    root = trace.SpanContext(tid, sid, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    return trace.set_span_in_context(trace.NonRecordingSpan(root))


def _parent(run_id: str) -> Any:
    """Where a new span of ``run_id`` hangs: the current span when it is the run's, else the
    context of the message being handled when it is the run's, else the run's root."""
    wanted = trace_id(run_id)
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == wanted:
        return None  # the current context
    headers = _received.get()
    if headers:
        carried = propagate.extract(dict(headers))
        if trace.get_current_span(carried).get_span_context().trace_id == wanted:
            return carried
    return _run_root(run_id)


def _tracer() -> Any:
    return _provider().get_tracer("durable")


@contextlib.contextmanager
def span(
    name: str,
    run_id: str,
    attributes: dict[str, Any],
    *,
    link_caller: bool = False,
    start_ns: int | None = None,
) -> Iterator[Any]:
    """A span of ``run_id``'s trace, current inside the block; the exception that escapes the
    block is recorded on it. ``link_caller`` links it to the span that was current before;
    ``start_ns``: when its work began, if before the block (``time.time_ns()``)."""
    if not enabled():
        yield None
        return
    links = []
    caller = trace.get_current_span().get_span_context()
    if link_caller and caller.is_valid and caller.trace_id != trace_id(run_id):
        links.append(trace.Link(caller))
    parent = _parent(run_id)
    with _tracer().start_as_current_span(
        name, context=parent, attributes=_clean(attributes), links=links, start_time=start_ns
    ) as current:
        yield current


def record_span(
    name: str,
    run_id: str,
    attributes: dict[str, Any],
    start: datetime | None,
    end: datetime | None,
    error: dict[str, Any] | None = None,
) -> None:
    """A span for work that already happened (a step attempt a turn ran or judged), with its
    recorded times."""
    if not enabled():
        return
    started = _nanos(start)
    current = _tracer().start_span(
        name, context=_parent(run_id), attributes=_clean(attributes), start_time=started
    )
    if error is not None:
        fail(current, error)
    current.end(end_time=max(_nanos(end) or 0, started or 0) or None)


def fail(current: Any, error: dict[str, Any] | None) -> None:
    """Mark ``current`` as failed with durable's error shape."""
    if trace is None or current is None or error is None:
        return
    current.set_status(trace.Status(trace.StatusCode.ERROR, str(error.get("message") or "")[:500]))
    current.set_attribute("durable.error.type", str(error.get("type") or ""))
    if error.get("code"):
        current.set_attribute("durable.error.code", str(error["code"]))


def headers() -> dict[str, str]:
    """The trace headers of the current span, for a message sent from here ({} when none)."""
    # Only a recording span: without an SDK the current span is the run's placeholder root.
    if not enabled() or not trace.get_current_span().is_recording():
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def received(message_headers: Mapping[str, Any] | None) -> contextvars.Token[Mapping[str, Any] | None]:
    """Note the trace headers of the message a task now handles; undo with ``forget``."""
    carried = {k: message_headers[k] for k in HEADER_NAMES if message_headers and message_headers.get(k)}
    return _received.set(carried or None)


def forget(token: contextvars.Token[Mapping[str, Any] | None]) -> None:
    with contextlib.suppress(ValueError):  # set in another context (a task run elsewhere)
        _received.reset(token)


def _nanos(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp() * 1_000_000_000)


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}
