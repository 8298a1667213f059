"""Updates of the replay context: ``ctx.wait_for_update``, ``ctx.wait_for_message`` and
``ctx.reply``.

An update is a signal that ``durable.update`` sent after the workflow's validator accepted it.
A wait for an update takes the oldest update of its name not taken yet; a wait for a message, the
oldest signal or update of any of its names (a signal under its ``signals``, an update under its
``updates``: an update is never taken as a signal there, so every update it takes can be
answered). A reply is recorded at its own position, and the engine writes it onto the update in
the same transaction, so the caller of ``durable.update(..., wait=...)`` reads it once that turn
commits, and never twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import InvalidInput
from ..statuses import UPDATE_WAITS
from ..values import stored
from .history import COMPLETED
from .waits import Waits, check_names, joined

MESSAGE_CALL = "ctx.wait_for_message()"


@dataclass(frozen=True)
class Update:
    """An update a workflow body received with ``ctx.wait_for_update``; answer it with
    ``ctx.reply(update, value)``."""

    #: The update's id, as ``durable.update`` returned it to its caller.
    id: int
    #: The update's name.
    name: str
    #: Its payload, as the validator accepted it (JSON round-tripped).
    payload: Any


@dataclass(frozen=True)
class Signal:
    """A signal a workflow body received with ``ctx.wait_for_message``."""

    #: The signal's name.
    name: str
    #: Its payload.
    payload: Any


def received_update(received: dict[str, Any]) -> Update:
    """The ``Update`` a body receives for the answer recorded at a wait for an update."""
    return Update(received["id"], received["name"], received["payload"])


def received_message(received: dict[str, Any]) -> Signal | Update:
    """The ``Signal`` or ``Update`` a body receives for the answer recorded at a wait for a message."""
    if "id" in received:
        return received_update(received)
    return Signal(received["name"], received["payload"])


class Updates(Waits):
    """Mixed into ``Context``."""

    def wait_for_update(self, name: str, timeout: Any = None) -> Update:
        """Return the next update ``name`` sent to this run with ``durable.update`` (buffered if it
        came first); raise WaitTimeout past ``timeout``."""
        return received_update(self._settle(self._update_wait(name, timeout)()))

    def _update_wait(self, name: str, timeout: Any) -> Callable[[], Any]:
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"ctx.wait_for_update() needs an update name, got {name!r}")
        rec = self._wait_position("update", name, timeout, {})

        def take(now: datetime) -> tuple[bool, Any]:
            buffered = self._take_signal(rec, lambda s: s.update and s.name == rec.name)
            if buffered is None:
                return False, None
            return True, {"id": buffered.id, "name": buffered.name, "payload": buffered.payload}

        return lambda: self._resolve_wait(rec, take, f"no update {rec.name!r} arrived before the timeout")

    def wait_for_message(
        self, *, signals: Any = (), updates: Any = (), timeout: Any = None
    ) -> Signal | Update:
        """Return the oldest signal sent under one of ``signals`` or update under one of
        ``updates`` not taken yet (a ``durable.Signal`` or a ``durable.Update``, which
        ``ctx.reply`` answers); raise WaitTimeout past ``timeout``."""
        return received_message(self._settle(self._message_wait(signals, updates, timeout)()))

    def _message_wait(self, signals: Any, updates: Any, timeout: Any) -> Callable[[], Any]:
        wanted_signals = check_names(signals, what="signal names", call=MESSAGE_CALL, empty=True)
        wanted_updates = check_names(updates, what="update names", call=MESSAGE_CALL, empty=True)
        if not wanted_signals and not wanted_updates:
            raise InvalidInput(
                f"{MESSAGE_CALL} needs at least one name to wait for: signals=[...], updates=[...] or both"
            )
        name = joined(wanted_signals + wanted_updates, call=MESSAGE_CALL)
        rec = self._wait_position(
            "message", name, timeout, {"signals": wanted_signals, "updates": wanted_updates}
        )

        def take(now: datetime) -> tuple[bool, Any]:
            buffered = self._take_signal(
                rec, lambda s: s.name in (wanted_updates if s.update else wanted_signals)
            )
            if buffered is None:
                return False, None
            received = {"name": buffered.name, "payload": buffered.payload}
            return True, ({"id": buffered.id, **received} if buffered.update else received)

        missed = (
            f"no signal of {wanted_signals!r} nor update of {wanted_updates!r} arrived before the timeout"
        )
        return lambda: self._resolve_wait(rec, take, missed)

    def reply(self, update: Update, value: Any) -> None:
        """Answer ``update`` with ``value`` (JSON, or a type durable converts):
        ``durable.update(..., wait=...)`` returns it to the update's caller. Each update is
        answered once."""
        if not isinstance(update, Update):
            raise InvalidInput(
                "ctx.reply() answers the durable.Update that ctx.wait_for_update() or "
                f"ctx.wait_for_message() returned, got {update!r}"
            )
        records = self._turn.records.values()
        if not any(
            r.kind in UPDATE_WAITS and r.status == COMPLETED and (r.output or {}).get("id") == update.id
            for r in records
            if r.seq < self._next
        ):
            raise InvalidInput(
                f"ctx.reply() got update {update.id} ({update.name!r}), which this run's "
                "ctx.wait_for_update() or ctx.wait_for_message() has not received"
            )
        if any(
            r.kind == "reply" and (r.input or {}).get("update") == update.id
            for r in records
            if r.seq < self._next
        ):
            raise InvalidInput(f"update {update.id} ({update.name!r}) was already answered by ctx.reply()")
        what = f"the reply to update {update.name!r}"
        answer = stored(value, what=what, max_bytes=self._limits.max_payload_bytes)
        if self._position("reply", update.name) is not None:
            return  # recorded, and written onto the update, by the turn that made it
        rec = self._new("reply", update.name, status=COMPLETED, input={"update": update.id}, output=answer)
        rec.finished_at = self._now()
