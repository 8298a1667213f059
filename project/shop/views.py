"""The example's async view: it starts a run and awaits its result without holding a thread."""

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import durable

from .workflows import quote


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
