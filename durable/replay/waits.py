"""Waits of the replay context: ``ctx.wait_for_signal``, ``ctx.wait_for_any_signal`` and
``ctx.wait_for_event``.

A wait for a signal takes the oldest signal of its name sent to this run and not taken yet (an
update counts as a signal of its name); a wait for any of several names, the oldest among them. A wait
for an event receives the oldest event of its name within EVENT_BUFFER_TTL whose payload holds
every key/value of its ``match`` and that this run has not received yet; the event's id is kept on
the position, so no run receives one event twice (see ``engine/events.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..durations import parse_duration
from ..errors import InvalidInput, WaitTimeout
from ..values import json_value
from .history import COMPLETED, FAILED, BufferedSignal, Record
from .positions import Pending, Positions

#: What a position's name may hold (the ``Checkpoint.name`` column).
NAME_LENGTH = 255


class Waits(Positions):
    """Mixed into ``Context``."""

    def wait_for_signal(self, name: str, timeout: Any = None) -> Any:
        """Return the payload of the next signal ``name``; raise WaitTimeout past ``timeout``."""
        return self._settle(self._signal_wait(name, timeout)())

    def wait_for_any_signal(self, names: Any, timeout: Any = None) -> tuple[str, Any]:
        """Return ``(name, payload)`` of the oldest signal sent to this run under any of ``names``
        and not taken yet; raise WaitTimeout past ``timeout``."""
        name, payload = self._settle(self._any_signal_wait(names, timeout)())
        return name, payload

    # Each wait takes its position, then answers through the callable it returns: at once in a
    # plain body, when its event loop is idle in an async one (``asyncbody``).

    def _signal_wait(self, name: str, timeout: Any) -> Callable[[], Any]:
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"ctx.wait_for_signal() needs a signal name, got {name!r}")
        rec = self._wait_position("signal", name, timeout, {})

        def take(now: datetime) -> tuple[bool, Any]:
            buffered = self._take_signal(rec, lambda s: s.name == rec.name)
            return (False, None) if buffered is None else (True, buffered.payload)

        return lambda: self._resolve_wait(rec, take, f"no signal {rec.name!r} arrived before the timeout")

    def _any_signal_wait(self, names: Any, timeout: Any) -> Callable[[], Any]:
        wanted = check_names(names)
        rec = self._wait_position(
            "any_signal", joined(wanted, call=ANY_SIGNAL_CALL), timeout, {"names": wanted}
        )

        def take(now: datetime) -> tuple[bool, Any]:
            buffered = self._take_signal(rec, lambda s: s.name in wanted)
            return (False, None) if buffered is None else (True, [buffered.name, buffered.payload])

        missed = f"none of the signals {wanted!r} arrived before the timeout"
        return lambda: self._resolve_wait(rec, take, missed)

    def _take_signal(self, rec: Record, accepts: Callable[[BufferedSignal], bool]) -> BufferedSignal | None:
        """Take the oldest buffered signal ``accepts`` for the wait at ``rec``, or None."""
        buffered = next((s for s in self._turn.buffered() if s.consumed_seq is None and accepts(s)), None)
        if buffered is not None:
            buffered.consumed_seq = rec.seq
            self._turn.consumed.append(buffered)
        return buffered

    def wait_for_event(self, name: str, match: dict[str, Any] | None = None, timeout: Any = None) -> Any:
        """Return the payload of the oldest event ``name`` published within EVENT_BUFFER_TTL whose
        payload holds every key/value of ``match`` and that this run has not received yet."""
        return self._settle(self._event_wait(name, match, timeout)())

    def _event_wait(self, name: str, match: dict[str, Any] | None, timeout: Any) -> Callable[[], Any]:
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"ctx.wait_for_event() needs an event name, got {name!r}")
        rec = self._wait_position("event", name, timeout, {"match": check_match(match)})

        def take(now: datetime) -> tuple[bool, Any]:
            if self._turn.find_event is None:
                return False, None
            since = now - self._limits.event_ttl
            found = self._turn.find_event(
                rec.name, rec.input.get("match"), since, received_events(self._turn.records)
            )
            if found is None:
                return False, None
            rec.input = {**rec.input, "event_id": found[0]}
            return True, found[1]

        missed = f"no event {rec.name!r} matching {rec.input.get('match')!r} arrived before the timeout"
        return lambda: self._resolve_wait(rec, take, missed)

    def _wait_position(self, kind: str, name: str, timeout: Any, input: dict[str, Any]) -> Record:
        """The position of a wait, recorded with its timeout (as ``wake_at``) when new."""
        try:
            delta = None if timeout is None else parse_duration(timeout, what="timeout")
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        rec = self._position(kind, name)
        if rec is None:
            rec = self._new(
                kind, name, input={**input, "timeout": None if delta is None else delta.total_seconds()}
            )
            rec.wake_at = None if delta is None else self._now() + delta
        return rec

    def _resolve_wait(self, rec: Record, take: Callable[[datetime], tuple[bool, Any]], missed: str) -> Any:
        """A wait answers from its record, else with what ``take`` finds now, else it fails with
        ``WaitTimeout`` past its timeout, else it is pending until then."""
        if rec.status == COMPLETED:
            return rec.output
        if rec.status == FAILED:
            return self._failure(WaitTimeout((rec.error or {}).get("message")), rec)
        now = self._now()
        found, value = take(now)
        if found:
            rec.status, rec.output, rec.finished_at, rec.wake_at = COMPLETED, value, now, None
            rec.changed()
            return rec.output
        if rec.wake_at is not None and rec.wake_at <= now:
            rec.status, rec.error, rec.finished_at = FAILED, WaitTimeout(missed).to_dict(), now
            rec.changed()
            return self._resolve_wait(rec, take, missed)
        return Pending(rec.wake_at)


ANY_SIGNAL_CALL = "ctx.wait_for_any_signal()"


def check_names(
    names: Any, *, what: str = "signal names", call: str = ANY_SIGNAL_CALL, empty: bool = False
) -> list[str]:
    """``names`` as a wait for several names takes them: a list of names (non-empty unless
    ``empty``), each once, in the given order."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not (names or empty):
        raise InvalidInput(
            f"{call} takes {'a' if empty else 'a non-empty'} list of {what} such as "
            f'["approve", "reject"], got {names!r}'
        )
    if not all(isinstance(name, str) and name for name in names):
        raise InvalidInput(f"{call} needs non-empty {what}, got {names!r}")
    wanted = list(dict.fromkeys(names))
    joined(wanted, call=call)
    return wanted


def joined(names: list[str], *, call: str) -> str:
    """The position's name of a wait for several names: the names joined with ``|``."""
    name = "|".join(dict.fromkeys(names))
    if len(name) > NAME_LENGTH:
        raise InvalidInput(
            f"the names of {call} take {len(name)} characters joined with '|'; at most "
            f"{NAME_LENGTH} fit: wait for fewer or shorter names"
        )
    return name


def check_match(match: Any) -> dict[str, Any] | None:
    """``match`` as a wait for an event takes it: None, or a dict of names to JSON scalars."""
    if match is None:
        return None
    scalars = (str, int, float, bool, type(None))
    if not isinstance(match, dict) or not all(
        isinstance(k, str) and isinstance(v, scalars) for k, v in match.items()
    ):
        raise InvalidInput(
            f"match must be a dict of payload keys to JSON scalars (str, number, bool, None), got {match!r}"
        )
    checked: dict[str, Any] = json_value(match, "match")
    return checked


def received_events(records: dict[int, Record]) -> set[int]:
    """Ids of the events this run's waits have received."""
    return {
        rec.input["event_id"]
        for rec in records.values()
        if rec.kind == "event" and rec.status == COMPLETED and "event_id" in (rec.input or {})
    }
