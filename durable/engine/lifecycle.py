"""What happens when a run finishes: its parent is woken, and a dead run is dead-lettered.

Called inside the transaction that made the run terminal, so a crash cannot separate the two.
"""

from __future__ import annotations

import logging

from .. import clock, conf, dispatch
from ..definitions import Workflow, registry
from ..errors import DurableError
from ..inputs import DeadLetter
from ..models import Run, Status

log = logging.getLogger("durable.engine")

DLQ_PREFIX = "dlq:"


def finished(run: Run) -> None:
    """Tell the world a run reached a terminal state (call inside that transaction)."""
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE)
    if run.parent_id and runs.wake(run.parent_id, clock.now(), clock.now() + settings.LEASE):
        parent_queue = runs.filter(id=run.parent_id).values_list("queue", flat=True).first()
        dispatch.advance(run.parent_id, parent_queue or settings.DEFAULT_QUEUE)
    if run.status == Status.DEAD:
        dead_letter(run)


def dead_letter(run: Run) -> None:
    """Start the dead-letter workflow for ``run`` as ``dlq:<run id>``, once."""
    if run.id.startswith(DLQ_PREFIX):
        return  # a dead-letter handler that dies is not routed again
    handler = _handler_for(run)
    if handler is None:
        return
    from ..api import start

    letter = DeadLetter(dead_run_id=run.id, workflow=run.workflow, input=run.input, error=run.error)
    try:
        start(handler, letter.to_dict(), run_id=f"{DLQ_PREFIX}{run.id}", namespace=run.namespace or None)
    except DurableError as exc:
        log.warning("durable: could not dead-letter run %s to %r: %s", run.id, handler, exc)


def _handler_for(run: Run) -> Workflow | str | None:
    try:
        definition = registry.workflow(run.workflow, run.version)
    except DurableError:
        definition = None
    handler = definition.dead_letter if definition is not None else None
    return handler or conf.get().DEAD_LETTER_WORKFLOW
