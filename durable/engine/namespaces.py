"""Why a worker of one namespace found no work in a message: the run is another namespace's.

The guarded statements that claim a turn or take an attempt name the worker's namespace, so a
misrouted or forged message changes nothing; this module only says so in the log, with one read
made after such a statement matched nothing (never on the path that does the work).
"""

from __future__ import annotations

import logging

from .. import conf, routing
from ..models import Run

log = logging.getLogger("durable.engine")


def refused(run_id: str, what: str, settings: conf.Settings) -> bool:
    """Whether ``run_id`` belongs to a namespace this worker does not serve (logged as ``what``
    refused); False for a run of its own, or one that does not exist."""
    if not settings.NAMESPACE:
        return False
    found = Run.objects.using(settings.DATABASE).filter(id=run_id).values_list("namespace", flat=True)
    theirs = found.first()
    if theirs is None or routing.serves(settings.NAMESPACE, theirs):
        return False
    warn(run_id, what, theirs, settings)
    return True


def warn(run_id: str, what: str, theirs: str | None, settings: conf.Settings) -> None:
    log.warning(
        "durable: refused %s of run %s: the run is of namespace %r and this worker serves %r only "
        "(a misrouted or forged message); nothing changed",
        what,
        run_id,
        theirs or "",
        settings.NAMESPACE,
        extra={"run_id": run_id},
    )
