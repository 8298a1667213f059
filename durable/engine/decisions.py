"""A remote turn's decision (``durable.decision``), applied by a worker with the database with
the writes a local turn makes (``turn.finish``), while the turn that sent it still holds the run.

The turn id is the lease owner the claim wrote. A decision is applied only while the run is still
locked by that owner, under its row lock, and the apply releases the lease in the same
transaction: a duplicated decision, or one whose lease was taken over, changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from .. import clock, conf, dispatch, routing
from ..errors import PayloadUndecodable
from ..models import Run, Status
from ..replay import wire
from ..statuses import Decided, Turned
from . import namespaces, turn, turn_writes

log = logging.getLogger("durable.engine")


def apply(message: dict[str, Any]) -> Turned | Decided:
    """Apply a ``durable.decision``; say what became of it: the run's new status, ``refused``
    (duplicated, or its lease was taken over) or ``rerun`` (a wake landed during the turn)."""
    settings = conf.get()
    db = settings.DATABASE
    run_id, owner = message.get("run_id") or "", message.get("turn") or ""
    try:
        state, outcome = wire.decided_in(message, conf.codec())
    except PayloadUndecodable as exc:
        # Refused like a forged decision: nothing written, the lease lapses, the turn is resent.
        log.warning(
            "durable: decision of turn %s refused (%s): %s",
            owner,
            exc.code,
            exc,
            extra={"run_id": run_id},
        )
        return Turned.REFUSED
    try:
        with transaction.atomic(using=db):
            # The row lock orders this apply against a takeover and against a copy of itself.
            run = Run.objects.using(db).select_for_update().filter(id=run_id).first()
            if run is None or run.locked_by != owner or not owner or run.status != Status.RUNNING:
                log.warning(
                    "durable: decision of turn %s refused: run %s is not held by that turn "
                    "(applied already, or its lease was taken over)",
                    owner,
                    run_id,
                    extra={"run_id": run_id},
                )
                return Turned.REFUSED
            if not routing.serves(settings.NAMESPACE, run.namespace):
                namespaces.warn(run_id, f"the decision of turn {owner}", run.namespace, settings)
                return Turned.REFUSED
            run.wakes = message.get("wakes", run.wakes)  # as the turn read them: a later wake reruns it
            turn.finish(run, owner, None, state, outcome, settings)
    except turn_writes._Stale:
        # A wake landed while the remote worker replayed: run the turn again on what is now true.
        with transaction.atomic(using=db):
            if Run.objects.using(db).release(run_id, owner, clock.now(), clock.now()):
                dispatch.advance(run_id, run.queue or settings.DEFAULT_QUEUE)
        return Turned.RERUN
    return Turned.BLOCKED if outcome.blocked else outcome.status
