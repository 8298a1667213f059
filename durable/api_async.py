"""The client API for ``async def`` views and ASGI servers: awaitable twins of ``durable.api``.

Each twin runs its sync twin through ``asgiref.sync.sync_to_async`` (thread-sensitive, Django's
default), so it uses the same thread and database connection as Django's async ORM in the same
request, and the same transaction rules: the messages a call causes go out when the surrounding
transaction commits, which for async code (no ``atomic`` block: Django refuses ATOMIC_REQUESTS
on async views) is at once. Waits (``aresult``, ``aupdate(wait=...)``, ``aquery(timeout=...)``)
hold no thread: they await the end notice or ``asyncio.sleep`` between short reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from . import api, api_updates, calls
from .definitions import Workflow
from .durations import parse_duration

if TYPE_CHECKING:
    from .models import Run


async def astart(
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
) -> api.RunHandle:
    """Create a run, as ``durable.start`` does."""
    return await sync_to_async(api.start)(
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


async def adebounce(
    workflow: Workflow | str, input: Any = None, *, key: str, period: Any, max_wait: Any = None
) -> api.RunHandle:
    """Gather a call into its key's burst, as ``durable.debounce`` does."""
    return await sync_to_async(api.debounce)(workflow, input, key=key, period=period, max_wait=max_wait)


async def asignal(run_id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None) -> None:
    """Deliver a signal, as ``durable.signal`` does."""
    await sync_to_async(api.signal)(run_id, name, payload, idempotency_key=idempotency_key)


async def asignal_with_start(
    workflow: Workflow | str, input: Any = None, *, run_id: str, signal: str, payload: Any = None
) -> api.RunHandle:
    """Start the run unless it exists, then signal it, as ``durable.signal_with_start`` does."""
    return await sync_to_async(api.signal_with_start)(
        workflow, input, run_id=run_id, signal=signal, payload=payload
    )


async def aupdate(
    run_id: str, name: str, payload: Any = None, *, wait: Any = None, idempotency_key: str | None = None
) -> Any:
    """Send an update, as ``durable.update`` does; with ``wait``, await its reply."""
    sent = await sync_to_async(api_updates.send_update)(
        run_id, name, payload, wait=wait, idempotency_key=idempotency_key
    )
    return await _until(sent) if isinstance(sent, api_updates.Awaited) else sent


async def aquery(run_id: str, name: str | None = None, *, timeout: Any = None) -> Any:
    """Read what the run exposed, as ``durable.query`` does; with ``timeout``, await it."""
    return await _until(await sync_to_async(api_updates.query_wait)(run_id, name, timeout=timeout))


async def acancel(
    run_id: str, *, compensate: bool = False, reason: str | None = None, interrupt: bool = False
) -> bool:
    """Cancel an unfinished run, as ``durable.cancel`` does."""
    return await sync_to_async(api.cancel)(run_id, compensate=compensate, reason=reason, interrupt=interrupt)


async def aretry(run_id: str) -> api.RunHandle:
    """Run a failed, dead or cancelled run again, as ``durable.retry`` does."""
    return await sync_to_async(api.retry)(run_id)


async def aget_run(run_id: str) -> Run:
    """Return the run row, as ``durable.get_run`` does."""
    return await sync_to_async(api.get_run)(run_id)


async def _until(awaited: api_updates.Awaited) -> Any:
    """``api_updates.until`` on the event loop: a short read in a thread, then a sleep."""
    started = time.monotonic()
    pause = calls.FIRST_POLL
    while True:
        found = await sync_to_async(awaited.look)()
        if found is not api_updates.NOT_YET:
            return found
        api_updates.give_up_if_late(awaited, started)
        await asyncio.sleep(pause)
        pause = calls.next_poll(pause)


async def awrite_stream(key: str, value: Any) -> None:
    """Inside an ``async def`` step: append to the run's stream, as ``durable.write_stream``."""
    await sync_to_async(api.write_stream, thread_sensitive=False)(key, value)


async def aread_stream(run_id: str, key: str, *, timeout: Any = None) -> AsyncIterator[Any]:
    """The values of a run's stream, as ``durable.read_stream`` yields them, without blocking the
    event loop: for an async view's server-sent events."""
    from .engine import streams

    # Checked as the sync twin checks them (RunNotFound, a bad key or timeout), then followed.
    await sync_to_async(api.read_stream)(run_id, key, timeout=timeout)
    limit = None if timeout is None else parse_duration(timeout, what="timeout").total_seconds()
    follower = streams.Follower(run_id, key, limit)
    look = sync_to_async(follower.look)
    while True:
        batch, over = await look()
        for value in batch:
            yield value
        if over:
            return
        if not batch:
            await asyncio.sleep(follower.wait())
