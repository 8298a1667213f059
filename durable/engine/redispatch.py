"""Lost step messages, found without a blind timer: a probe sent down a queue overtakes.

A broker keeps one queue's messages in order, so when a message sent down a queue at T is taken,
every step message sent down that queue before T was taken too; an attempt sent before T (less
a slack for a publish that trailed its commit) that is still not started was lost. The orphan
sweep sends one probe per queue that holds attempts not taken for a while; the worker that takes
the probe has their turns send them again at once. A queue backed up behind a backlog is not
flooded: its probe waits behind the backlog, and finds everything ahead of it taken.
STEP_REDISPATCH_AFTER stays the bound when no probe gets through (no worker on the queue).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.utils.dateparse import parse_datetime

from .. import clock, conf, dispatch
from ..models import Checkpoint, Run

log = logging.getLogger("durable.engine")

#: How long an attempt goes untaken before its queue is probed, and how much sooner than a probe
#: an attempt must have been sent to count as overtaken: a message leaves after its commit.
SLACK = timedelta(seconds=2)
#: Batches one probe takes at most.
MAX_BATCHES = 20


def probe_queues() -> int:
    """Send a probe down each queue that holds step attempts sent and not taken for a while."""
    settings = conf.get()
    now = clock.now()
    attempts = Checkpoint.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
    queues = attempts.untaken_queues(now - SLACK)
    for queue in queues:
        dispatch.probe(queue, now.isoformat())
    return len(queues)


def probed(queue: str, sent_at: str) -> int:
    """A probe sent down ``queue`` at ``sent_at`` was taken: send again, through their runs'
    turns, the attempts of that queue sent before it and still not taken. Return how many runs."""
    settings = conf.get()
    sent = parse_datetime(sent_at) if isinstance(sent_at, str) else None
    if sent is None:
        log.warning("durable: dropped a queue probe with no valid time: %r", sent_at)
        return 0
    woken = 0
    for _ in range(MAX_BATCHES):
        now = clock.now()
        with transaction.atomic(using=settings.DATABASE):
            attempts = Checkpoint.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
            run_ids = attempts.overtaken(queue, sent - SLACK, settings.TIMER_BATCH_SIZE)
            _wake(run_ids, now, settings)
        woken += len(run_ids)
        if len(run_ids) < settings.TIMER_BATCH_SIZE:
            break
    if woken:
        log.warning(
            "durable: %d run(s) had step messages on queue %r that a later message overtook "
            "(lost, e.g. by a broker restart or flush); sent again",
            woken,
            queue,
        )
    return woken


def redispatch(run_ids: Iterable[str]) -> int:
    """Send again now the step attempts of these runs that were sent and not taken, with a fresh
    STEP_REDISPATCH_LIMIT (for an operator, say once a worker for their queue runs); return how
    many attempts. A message of the old send that still arrives is refused (its token changed)."""
    settings = conf.get()
    ids = list(dict.fromkeys(run_ids))
    now = clock.now()
    with transaction.atomic(using=settings.DATABASE):
        count = Checkpoint.objects.using(settings.DATABASE).unsend(ids, fresh_budget=True)
        _wake(ids, now, settings)
    return count


def _wake(run_ids: list[str], now: datetime, settings: conf.Settings) -> None:
    runs = Run.objects.using(settings.DATABASE)
    queues = [(run_id, runs.wake(run_id, now, now + settings.LEASE)) for run_id in run_ids]
    dispatch.advance_many((run_id, queue) for run_id, queue in queues if queue)
