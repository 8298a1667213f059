"""``ctx.expose``: a named value the body shows to ``durable.query``; the last write wins.

Recorded once per position. A new expose sets its name in ``TurnState.exposed`` (the run's
values as stored when the turn began), which the engine writes onto the run in the transaction
that records the position: a replay finds the position and changes nothing.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInput
from ..values import stored
from .history import COMPLETED
from .positions import Positions
from .waits import NAME_LENGTH


class Queries(Positions):
    """Mixed into ``Context``."""

    def expose(self, name: str, value: Any) -> None:
        """Show ``value`` (JSON, or a type durable converts) under ``name`` to
        ``durable.query(run_id, name)``, replacing what this run exposed there before."""
        if not isinstance(name, str) or not name or len(name) > NAME_LENGTH:
            raise InvalidInput(
                f"ctx.expose() needs a name of 1 to {NAME_LENGTH} characters, got {name!r:.100}"
            )
        what = f"the value exposed as {name!r}"
        shown = stored(value, what=what, max_bytes=self._limits.max_payload_bytes)
        if self._position("expose", name) is not None:
            return  # recorded, and written onto the run, by the turn that made it
        rec = self._new("expose", name, status=COMPLETED, output=shown)
        rec.finished_at = self._now()
        self._turn.exposed[name] = shown
        self._turn.exposed_changed = True
