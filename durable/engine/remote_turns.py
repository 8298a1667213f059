"""Remote turns: a run whose workflow's turns are served by workers with no database.

A worker of durable's own claims the turn lease as for a local turn, then sends the turn as a
``durable.remote_turn`` message carrying what the replay needs (protocol v1, ``turn.json``). The
remote worker replays the body and answers with ``durable.decision``; a worker with the database
applies it with the writes a local turn makes (``decisions.apply``).

The turn id is the lease owner the claim wrote. A decision is applied only while the run is still
locked by that owner, under its row lock, and the apply releases the lease in the same
transaction: a duplicated decision, or one whose lease was taken over, changes nothing. The lease
is not renewed here; the remote worker's ``durable.turn_heartbeat`` messages keep it. A turn whose
decision never comes lets the lease lapse, and the orphan sweep sends the turn again.
"""

from __future__ import annotations

import logging

from .. import clock, conf, dispatch, routing
from ..definitions import registry
from ..errors import WorkflowNotRegistered
from ..models import Run
from ..replay import wire
from ..replay.history import Limits
from ..replay.turnstate import RunFacts
from ..statuses import Turned
from . import histories, observe

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


def send(run: Run, owner: str, settings: conf.Settings, limits: Limits, *, first: bool) -> str:
    """Send the turn of ``run``, whose lease ``owner`` just claimed, to its remote workers, with
    the ``limits`` its replay judges by."""
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
        limits,
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
