"""``ctx.wait_for_event``: the replay core's side of events (see ``engine/events.py``).

A wait receives the oldest event of its name within EVENT_BUFFER_TTL whose payload holds every
key/value of its ``match`` and that this run has not received yet; the event's id is kept on the
position, so no run receives one event twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput
from .history import COMPLETED, Record, roundtrip

if TYPE_CHECKING:
    from .context import Context


class EventWaits:
    """Mixed into ``Context``."""

    def wait_for_event(self: Context, name: str, match: dict[str, Any] | None = None, timeout: Any = None) -> Any:
        """Return the payload of the oldest event ``name`` published within EVENT_BUFFER_TTL whose
        payload holds every key/value of ``match`` and that this run has not received yet."""
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"ctx.wait_for_event() needs an event name, got {name!r}")
        rec = self._wait_position("event", name, timeout, {"match": check_match(match)})

        def take(now: datetime) -> tuple[bool, Any]:
            if self._state.find_event is None:
                return False, None
            since = now - self._limits.event_ttl
            found = self._state.find_event(rec.name, rec.input.get("match"), since, received_events(self._state.records))
            if found is None:
                return False, None
            rec.input = {**rec.input, "event_id": found[0]}
            return True, found[1]

        missed = f"no event {rec.name!r} matching {rec.input.get('match')!r} arrived before the timeout"
        return self._settle(self._resolve_wait(rec, take, missed))


def check_match(match: Any) -> dict[str, Any] | None:
    """``match`` as a wait for an event takes it: None, or a dict of names to JSON scalars."""
    if match is None:
        return None
    scalars = (str, int, float, bool, type(None))
    if not isinstance(match, dict) or not all(isinstance(k, str) and isinstance(v, scalars) for k, v in match.items()):
        raise InvalidInput(
            f"match must be a dict of payload keys to JSON scalars (str, number, bool, None), got {match!r}"
        )
    return roundtrip(match, what="match")


def received_events(records: dict[int, Record]) -> set[int]:
    """Ids of the events this run's waits have received."""
    return {
        rec.input["event_id"] for rec in records.values()
        if rec.kind == "event" and rec.status == COMPLETED and "event_id" in (rec.input or {})
    }
