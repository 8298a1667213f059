"""The retention sweep's share of large payloads: delete the objects whose rows were deleted
(released) and the objects a rolled-back transaction wrote and nothing refers to (orphans)."""

from __future__ import annotations

import logging
from datetime import datetime

from .. import clock, conf
from ..models import offloads

log = logging.getLogger("durable.engine")

#: Objects one pass deletes at most, of each kind; a backlog drains over several passes.
BATCH = 1000

#: When this process lists the storage for orphans next: a listing names every object, so it runs
#: once per ORPHAN_GRACE rather than at every retention pass.
_next_orphan_scan: datetime | None = None


def sweep_offloads() -> int:
    """Delete released objects, and orphans when a listing is due; return how many objects went."""
    global _next_orphan_scan
    db = conf.get().DATABASE
    gone = offloads.purge_released(db, BATCH)
    now = clock.now()
    if _next_orphan_scan is None or now >= _next_orphan_scan:
        _next_orphan_scan = now + offloads.ORPHAN_GRACE
        orphans = offloads.delete_orphans(db, BATCH)
        if orphans:
            log.warning(
                "durable: deleted %s offloaded payload object(s) that no row referred to (written by "
                "transactions that rolled back)",
                orphans,
            )
        gone += orphans
    return gone
