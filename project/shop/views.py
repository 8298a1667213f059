"""The example's views: an async view that starts a run and awaits its result without holding a
thread, and a page that shows a run's stream live (server-sent events, from an async view under
an ASGI server, or from a sync view's generator under WSGI)."""

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import durable

from .workflows import quote

#: The stream the tracking page follows (``workflows.track`` writes it).
TRACKING = "tracking"


@csrf_exempt  # an API endpoint for scripts; a form view keeps Django's CSRF check
@require_POST
async def quote_order(request: HttpRequest) -> JsonResponse:
    """Price the order posted as JSON; answer 202 with the run's id if it takes over 10 seconds."""
    order = json.loads(request.body)
    handle = await durable.astart(quote, order)
    try:
        priced = await handle.aresult(timeout="10s")
    except durable.WaitTimeout:
        return JsonResponse({"run_id": handle.id, "status": await handle.astatus()}, status=202)
    return JsonResponse({"run_id": handle.id, **priced})


def track_page(request: HttpRequest, run_id: str) -> HttpResponse:
    """A page that lists the run's tracking values as they come. ``?sync=1`` follows them through
    the sync view (a WSGI server); by default through the async one (an ASGI server)."""
    _known(run_id)
    view = "shop-track-events-sync" if request.GET.get("sync") else "shop-track-events"
    return render(request, "shop/track.html", {"run_id": run_id, "events": view})


async def track_events(request: HttpRequest, run_id: str) -> StreamingHttpResponse:
    """The run's tracking stream as server-sent events, without holding a thread while it waits."""
    if not await _exists(run_id):
        _missing(run_id)

    async def events() -> AsyncIterator[str]:
        async for value in durable.aread_stream(run_id, TRACKING):
            yield _event(value)
        yield _event({}, "end")

    return _sse(events())


def track_events_sync(request: HttpRequest, run_id: str) -> StreamingHttpResponse:
    """The same from a sync view: a generator the WSGI server sends as it yields."""
    _known(run_id)

    def events() -> Iterator[str]:
        for value in durable.read_stream(run_id, TRACKING):
            yield _event(value)
        yield _event({}, "end")

    return _sse(events())


def _event(value: Any, name: str | None = None) -> str:
    # default=str: a value durable gives back typed (a Decimal, a datetime) goes out as text.
    return (f"event: {name}\n" if name else "") + f"data: {json.dumps(value, default=str)}\n\n"


def _sse(events: Any) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response


def _known(run_id: str) -> None:
    try:
        durable.get_run(run_id)
    except durable.RunNotFound:
        _missing(run_id)


async def _exists(run_id: str) -> bool:
    try:
        await durable.aget_run(run_id)
    except durable.RunNotFound:
        return False
    return True


def _missing(run_id: str) -> None:
    raise Http404(f"no run has id {run_id!r}")
