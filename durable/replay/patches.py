"""``ctx.patched`` and ``ctx.deprecate_patch``: change a workflow's code under running runs.

A patch marker records that a run took the new branch of a change. Markers are stepped over by
any other primitive (see ``Context._position``), so once no run from before a change is left,
the ``patched()`` call can become ``deprecate_patch()`` and then be deleted: histories with and
without the marker replay either way.
"""

from __future__ import annotations

from ..errors import InvalidInput
from .history import COMPLETED, Record
from .positions import Positions

PATCH = "patch"


class Patches(Positions):
    """Mixed into ``Context``."""

    def patched(self, change_id: str) -> bool:
        """True on runs that reach this point with the change; False on runs recorded before it."""
        rec, seq = self._patch_at(change_id)
        if rec is None:
            self._mark(seq, change_id)
            return True
        if rec.kind == PATCH and rec.name == change_id:
            self._take(seq)
            return True
        return False  # recorded before the change: the position is the old branch's

    def deprecate_patch(self, change_id: str) -> None:
        """The new branch of ``patched(change_id)`` is the only one left: runs that recorded the
        marker and runs that did not both replay. Once no run from before the change is left, the
        call can be deleted too."""
        rec, seq = self._patch_at(change_id)
        if rec is None:
            # Recorded still, so that workers on the code with patched() replay new runs' new branch.
            self._mark(seq, change_id)
        elif rec.kind == PATCH and rec.name == change_id:
            self._take(seq)

    def _patch_at(self, change_id: str) -> tuple[Record | None, int]:
        """The record the marker of ``change_id`` would take (markers of other changes, whose
        calls may have been deleted, are stepped over) and its position."""
        if not isinstance(change_id, str) or not change_id:
            raise InvalidInput(f"a patch's change_id is a non-empty string, got {change_id!r}")
        self._guard()
        seq = self._next
        rec = self._turn.records.get(seq)
        while rec is not None and rec.kind == PATCH and rec.name != change_id:
            seq += 1
            rec = self._turn.records.get(seq)
        return rec, seq

    def _mark(self, seq: int, change_id: str) -> None:
        self._take(seq)
        rec = self._new(PATCH, change_id, status=COMPLETED)
        rec.finished_at = self._now()
