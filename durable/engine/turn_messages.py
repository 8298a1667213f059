"""Send what a turn's ``ctx.signal`` / ``ctx.publish_event`` / ``ctx.start`` recorded, inside the
transaction that writes those positions: the message exists exactly when its position does.

Only rows are written here; the wakes and turns they cause go out after the commit. A signal
takes no lock on its target's run row (its wake runs on commit), so two runs that signal each
other never wait for each other's turn.
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction

from .. import clock, conf
from ..definitions import registry
from ..errors import WorkflowNotRegistered
from ..models import Signal
from ..replay.history import Outgoing
from . import events, lifecycle, runs

log = logging.getLogger("durable.engine")


def send(sender: str, outgoing: list[Outgoing]) -> None:
    """Write the messages of run ``sender``'s turn, in the caller's transaction."""
    for message in outgoing:
        if message.kind == "signal":
            _signal(sender, message)
        elif message.kind == "event":
            events.publish(message.name, message.payload)
        else:
            _start(sender, message)


def _signal(sender: str, message: Outgoing) -> None:
    db = conf.get().DATABASE
    try:
        with transaction.atomic(using=db):
            Signal.objects.using(db).create(
                run_id=message.run_id, name=message.name, payload=message.payload, created_at=clock.now()
            )
    except IntegrityError:
        # The target was deleted since the turn looked it up: like a signal sent after its end.
        log.warning(
            "durable: run %s signalled %r to run %s, which no longer exists; dropped",
            sender,
            message.name,
            message.run_id,
        )
        return
    # A finished target keeps the signal unread, as it would one sent just before its end. Were
    # the wake lost with this process, the target's reconcile wake would find the signal.
    transaction.on_commit(lambda: lifecycle.wake(message.run_id), using=db)


def _start(sender: str, message: Outgoing) -> None:
    try:
        definition = registry.workflow(message.name, message.version)
    except WorkflowNotRegistered:
        definition = registry.workflow(message.name)  # checked when recorded; this worker is older
    try:
        with transaction.atomic(using=conf.get().DATABASE):
            # Never refused for a full singleton line: the sender's history already holds it.
            runs.create(
                definition,
                message.payload,
                run_id=message.run_id,
                namespace=message.namespace,
                queue_limit=False,
            )
    except IntegrityError:
        log.info("durable: run %s started run %s, which existed already", sender, message.run_id)
