"""Wakes that travel together: one ``durable.advance_batch`` message runs the turns of many runs.

A sweep wakes hundreds of runs at once, and a Celery message costs more to build and publish
than the sweep's SQL costs a run, so ``dispatch.advance_many`` shares a sweep's wakes out over a
few messages. The worker that takes one runs the turns of its runs one after the other, each
exactly as ``durable.advance`` would, until a turn is about to run a step's body in place (the
rest then leave in messages of their own: ``behind``). A turn that raises costs only its own
run, which the sweeps take back as any turn that died. Every run a sweep wakes keeps a ``wake_at`` a bounded
time ahead (RECONCILE_INTERVAL for a timer, LEASE for a wake, due at once for an orphan taken
back), so the timer sweep sends its turn again when the whole message is lost.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from django.db import InterfaceError, OperationalError

from .. import conf, dispatch, guards
from ..errors import InvalidInput
from ..models import UNFINISHED, Run, column_length
from . import behind, first_turns, lifecycle, turn

log = logging.getLogger("durable.engine")

#: Run ids one message may carry: ``dispatch.advance_many`` sends WAKE_BATCH; anything far larger
#: was not sent by durable and would hold a worker process for hours.
MAX_RUN_IDS = 1000


def valid_run_ids(value: Any) -> list[str]:
    """The run ids of a ``durable.advance_batch`` message; ``InvalidInput`` for anything durable
    does not send: not a list of non-empty strings that fit a run id, empty, or too long."""
    if not isinstance(value, list):
        raise guards.refuse("run_ids", f"must be a list of run ids, got {guards.shown(value)}")
    if not 0 < len(value) <= MAX_RUN_IDS:
        raise guards.refuse("run_ids", f"must hold 1 to {MAX_RUN_IDS} run ids, got {len(value)}")
    max_length = column_length("Run", "id")
    for position, run_id in enumerate(value):
        try:
            guards.run_id(run_id, max_length=max_length, reserved_ok=True)
        except InvalidInput as exc:
            raise guards.refuse("run_ids", f"item {position}: {exc}") from None
    return value


def advance_batch(run_ids: Any, *, redelivered: bool = False) -> list[str]:
    """Run the turns of ``run_ids`` in order, each as ``turn.advance`` does, until one is about
    to run a step's body in place: the rest then leave in messages of their own (``behind``).
    Return what became of each turn run here (``"error"`` for a turn that raised).

    ``redelivered``: the message came again after the process that had it died, so each run's
    committed and unpublished sends are sent again first (``lifecycle.resend_unsent``). A forged
    message is refused whole and changes nothing.
    """
    try:
        ids = valid_run_ids(run_ids)
    except InvalidInput as exc:
        log.warning("durable: refused a durable.advance_batch message: %s", exc)
        return []
    settings = conf.get()
    # Runs just started whose first turns fit one statement each: written before any claim.
    ahead = {} if redelivered else first_turns.ahead(ids, settings)
    outcomes: list[str] = []
    database_errors = 0
    limit, began = dispatch.time_limit(), time.monotonic()
    lease = settings.LEASE.total_seconds()
    handed: list[bool] = []

    def let_go(rest: list[str]) -> None:
        hand_over(rest, redelivered=redelivered)
        handed.append(True)

    for position, run_id in enumerate(ids):
        if run_id in ahead:
            outcomes.append(ahead[run_id])
            continue
        if position and limit is not None and limit - (time.monotonic() - began) < lease:
            # A Celery time limit the project set goes on ticking over the whole batch: as for
            # a turn run inline, one runs here only with at least a LEASE of it left.
            hand_over([left for left in ids[position:] if left not in ahead], redelivered=redelivered)
            break
        rest = [left for left in ids[position + 1 :] if left not in ahead]
        try:
            if redelivered:
                lifecycle.resend_unsent(run_id)
            with behind.waiting(partial(let_go, rest) if rest else None):
                outcomes.append(turn.advance(run_id))
            database_errors = 0
        except dispatch.SOFT_TIME_LIMIT_ERRORS:
            # The task's own time limit: the hard one follows, so stop here; the runs not yet
            # turned keep their redrive.
            raise
        except Exception as exc:  # noqa: BLE001 - one run's failure must not cost the others
            log.error(
                "durable: the turn of run %s raised; the rest of its batch goes on, the sweeps "
                "take the run back",
                run_id,
                exc_info=True,
            )
            outcomes.append("error")
            database_errors = (
                database_errors + 1 if isinstance(exc, (OperationalError, InterfaceError)) else 0
            )
            if database_errors == 2:
                # turn.advance waited for the database to answer, twice in a row in vain: the
                # database is down, and each run left would wait as long again.
                left = len(ids) - position - 1
                if left:
                    log.warning(
                        "durable: the database is not answering; %d run(s) of the batch left to the "
                        "timer sweep",
                        left,
                    )
                break
        if handed:
            break  # the turns behind it went on in messages of their own (``behind``)
    return outcomes


def advance_one(run_id: Any, *, redelivered: bool = False) -> str:
    """A ``durable.advance`` message's turn, as ``turn.advance`` runs it, its first written ahead
    when it fits (``first_turns``). ``redelivered``: as for a batch."""
    if redelivered:
        lifecycle.resend_unsent(run_id)
    elif isinstance(run_id, str):
        written = first_turns.ahead([run_id], conf.get())
        if written:
            return written[run_id]
    return turn.advance(run_id)


def hand_over(run_ids: list[str], *, redelivered: bool = False) -> None:
    """Send the turns of the unfinished ``run_ids`` in messages of their own (a batch's rest).
    Of a ``redelivered`` batch, each run's committed and unpublished sends go again with it, as
    they would have here."""
    if redelivered:
        for run_id in run_ids:
            lifecycle.resend_unsent(run_id)  # wakes the run and sends its turn
        return
    settings = conf.get()
    runs = Run.objects.using(settings.DATABASE).filter(id__in=run_ids, status__in=UNFINISHED)
    dispatch.advance_many(runs.values_list("id", "queue"))
