"""Remote turns: a run whose workflow's turns are served by workers with no database.

A worker of durable's own claims the turn lease as for a local turn, then sends the turn as a
``durable.remote_turn`` message carrying what the replay needs (protocol v1, ``turn.json``). The
remote worker replays the body and answers with ``durable.decision``; a worker with the database
applies it with the writes a local turn makes (``turn.finish``).

The turn id is the lease owner the claim wrote. A decision is applied only while the run is still
locked by that owner, under its row lock, and the apply releases the lease in the same
transaction: a duplicated decision, or one whose lease was taken over, changes nothing. The lease
is not renewed here; the remote worker's ``durable.turn_heartbeat`` messages keep it. A turn whose
decision never comes lets the lease lapse, and the orphan sweep sends the turn again.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from .. import clock, conf, dispatch, routing
from ..definitions import registry
from ..errors import PayloadUndecodable, WorkflowNotRegistered
from ..models import Run, Status
from ..replay import wire
from ..replay.turnstate import RunFacts
from ..statuses import Turned
from . import histories, namespaces, observe, turn, writes

log = logging.getLogger("durable.engine")

REMOTE_TURN = "durable.remote_turn"


def is_remote(run: Run, settings: conf.Settings) -> bool:
    """Whether ``run``'s turns run on remote workers: its workflow is declared ``remote=True``, or
    its queue is one of REMOTE_QUEUES."""
    try:
        if registry.workflow(run.workflow, run.version).remote:
            return True
    except WorkflowNotRegistered:
        pass
    return routing.remote_base(run.queue or "", frozenset(settings.REMOTE_QUEUES)) is not None


def send(run: Run, owner: str, settings: conf.Settings, *, first: bool) -> str:
    """Send the turn of ``run``, whose lease ``owner`` just claimed, to its remote workers."""
    if run.recovery_attempts > settings.MAX_RECOVERY_ATTEMPTS:
        turn.die(run, settings)
        return Status.DEAD
    db = settings.DATABASE
    # A first claim: nothing stored yet. The message says when the positions were read: the
    # remote worker judges what they tell of running attempts as of then.
    records, read_at = ({}, clock.now()) if first else histories.read(run.id, db)
    if first:
        observe.run_started(run)
    facts = RunFacts(
        run.id,
        run.workflow,
        run.version,
        run.namespace or None,
        run.input,
        run.deadline,
        run.cancel_request,
    )
    message = wire.turn_message(
        facts,
        records,
        histories.unconsumed_signals(run.id, db),
        dict(run.exposed or {}),
        turn.limits(settings),
        turn=owner,
        wakes=run.wakes,
        reply_to=routing.queue_in(settings.DEFAULT_QUEUE, run.namespace),
        lease_seconds=settings.LEASE.total_seconds(),
        now=read_at,
        codec=conf.codec(),  # payloads leave sealed, as their rows hold them
    )
    dispatch.remote_turn(message, run.queue or settings.DEFAULT_QUEUE)
    return Turned.REMOTE


def heartbeat(run_id: str, turn_id: str) -> bool:
    """Renew the lease of a remote turn still holding it; False if it no longer does."""
    settings = conf.get()
    renewed = Run.objects.using(settings.DATABASE).renew(run_id, turn_id, clock.now(), settings.LEASE)
    if not renewed:
        log.info("durable: turn heartbeat for run %s refused: turn %s no longer holds it", run_id, turn_id)
    return renewed


def apply(message: dict[str, Any]) -> str:
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
    except writes._Stale:
        # A wake landed while the remote worker replayed: run the turn again on what is now true.
        with transaction.atomic(using=db):
            if Run.objects.using(db).release(run_id, owner, clock.now(), clock.now()):
                dispatch.advance(run_id, run.queue or settings.DEFAULT_QUEUE)
        return Turned.RERUN
    return Turned.BLOCKED if outcome.blocked else outcome.status
