"""Entity primitives of the replay context: ``ctx.signal_entity`` and ``ctx.call_entity``.

Each sends one op, once per position: its op id derives from the run and the position, and the
turn stores it in its own transaction (``engine/entity_ops.py``), so a replay never sends it again.
``call_entity`` waits for the op's result, which the applier records at the position.
"""

from __future__ import annotations

from typing import Any

from ..durations import parse_duration
from ..entity_classes import registry
from ..errors import InvalidInput, StepFailed, WaitTimeout
from ..guards import plain_json, text
from .history import COMPLETED, FAILED, Record
from .positions import Pending, Positions

#: Longest entity key (the column's length).
MAX_KEY_LENGTH = 255


def entity_op_id(run_id: str, seq: int) -> str:
    """The op id of the op sent at position ``seq`` of ``run_id``: the same on every replay."""
    return f"run:{run_id}:{seq}"


class Entities(Positions):
    """Mixed into ``Context``."""

    def signal_entity(self, name: str, key: str, op: str, arg: Any = None) -> None:
        """Send ``op(arg)`` to entity (``name``, ``key``) without waiting; sent once per position."""
        self._entity_position(name, key, op, arg, call=False, timeout=None)

    def call_entity(self, name: str, key: str, op: str, arg: Any = None, timeout: Any = None) -> Any:
        """Send ``op(arg)`` to entity (``name``, ``key``) and return the op's result; raise
        ``StepFailed`` with the op's error if it raised, ``WaitTimeout`` past ``timeout``."""
        rec = self._entity_position(name, key, op, arg, call=True, timeout=timeout)
        return self._settle(self._resolve_entity(rec))

    def _entity_position(self, name: str, key: str, op: str, arg: Any, *, call: bool, timeout: Any) -> Record:
        where = "ctx.call_entity()" if call else "ctx.signal_entity()"
        text(name, f"{where} name", max_length=200, kind="entity name")
        text(key, f"{where} key", max_length=MAX_KEY_LENGTH, kind="key")
        text(op, f"{where} op", max_length=100, kind="operation name")
        try:
            delta = None if timeout is None else parse_duration(timeout, what=f"{where} timeout")
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        rec = self._position("entity", f"{name}:{op}")
        if rec is not None:
            return rec
        definition = registry.get(name)
        definition.method(definition.cls, op)  # an unknown op is refused before anything is stored
        spec = {
            "entity": name,
            "key": key,
            "op": op,
            "arg": plain_json(
                arg,
                f"the argument of entity {name!r} op {op!r}",
                max_bytes=self._limits.max_payload_bytes,
            ),
            "op_id": entity_op_id(self._facts.id, self._here),
            "call": call,
            "timeout": None if delta is None else delta.total_seconds(),
        }
        rec = self._new("entity", f"{name}:{op}", input=spec, queue=definition.queue or "")
        now = self._now()
        if not call:
            rec.status, rec.finished_at = COMPLETED, now
        elif delta is not None:
            rec.wake_at = now + delta
        return rec

    def _resolve_entity(self, rec: Record) -> Any:
        if rec.status == COMPLETED:
            return rec.output
        if rec.status == FAILED:
            error = rec.error or {}
            if error.get("type") == "WaitTimeout":
                return self._failure(WaitTimeout(error.get("message")), rec)
            return self._failure(StepFailed(cause=error), rec)
        now = self._now()
        if rec.wake_at is not None and rec.wake_at <= now:
            spec = rec.input or {}
            missed = WaitTimeout(
                f"entity {spec.get('entity')!r} key {spec.get('key')!r} did not apply op "
                f"{spec.get('op')!r} within {spec.get('timeout')} s"
            )
            rec.status, rec.error, rec.finished_at = FAILED, missed.to_dict(), now
            rec.changed()
            return self._resolve_entity(rec)
        # The applier settles this position and wakes the run; the reconcile wake backs it up.
        return Pending(rec.wake_at)
