"""``ctx.sleep``, ``ctx.sleep_until`` and the values a body draws from the clock and from chance
(``ctx.now``, ``ctx.uuid4``, ``ctx.random``): each recorded once, the same on every replay.

A timer is a position with a ``wake_at`` in the database, never a Celery ETA: the turn that finds
it due completes it, and the run sleeps until then.
"""

from __future__ import annotations

import random as _random
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..durations import parse_duration
from ..errors import InvalidInput
from .history import COMPLETED, Record
from .positions import Pending, Positions


class Timers(Positions):
    """Mixed into ``Context``."""

    def sleep(self, duration: Any) -> None:
        """Wait durably for ``duration`` (a timer in the database, never a Celery ETA)."""
        self._settle(self._resolve_timer(self._sleep_position(duration)))

    def sleep_until(self, when: datetime) -> None:
        """Wait durably until the aware datetime ``when``."""
        self._settle(self._resolve_timer(self._sleep_until_position(when)))

    def _sleep_position(self, duration: Any) -> Record:
        try:
            delta = parse_duration(duration, what="ctx.sleep()")
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        rec = self._position("sleep", "sleep")
        if rec is None:
            rec = self._new("sleep", "sleep", input={"seconds": delta.total_seconds()})
            rec.wake_at = self._now() + delta
        return rec

    def _sleep_until_position(self, when: datetime) -> Record:
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise InvalidInput(f"ctx.sleep_until() needs an aware datetime, got {when!r}")
        rec = self._position("sleep", "sleep")
        if rec is None:
            rec = self._new("sleep", "sleep", input={"until": when.isoformat()})
            rec.wake_at = when
        return rec

    def _resolve_timer(self, rec: Record) -> Any:
        if rec.status == COMPLETED:
            return None
        now = self._now()
        if rec.wake_at is None or rec.wake_at <= now:
            rec.status = COMPLETED
            rec.finished_at = now
            rec.changed()
            return None
        return Pending(rec.wake_at)

    def now(self) -> datetime:
        """The current time, recorded once and the same on every replay."""
        return datetime.fromisoformat(self._value("now", lambda: self._now().isoformat()))

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(self._value("uuid4", lambda: str(uuid.uuid4())))

    def random(self) -> float:
        return float(self._value("random", _random.random))

    def _value(self, name: str, make: Callable[[], Any]) -> Any:
        rec = self._position("value", name)
        if rec is None:
            rec = self._new("value", name, status=COMPLETED, output=make())
            rec.finished_at = self._now()
        return rec.output
