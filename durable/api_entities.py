"""Durable entities from views, shells and tasks: send ops, read states."""

from __future__ import annotations

import uuid
from typing import Any

from . import conf, guards
from .calls import column_length
from .entity_classes import registry


def signal_entity(name: str, key: str, op: str, arg: Any = None, *, op_id: str | None = None) -> str:
    """Send ``op(arg)`` to entity (``name``, ``key``): stored in the caller's transaction, applied
    after its commit, in arrival order. The same ``op_id`` again for this key is applied once.
    Return the op id (a new one when ``op_id`` is None)."""
    from .engine import entity_ops

    _check(name, key)
    definition = registry.get(name)
    guards.text(op, "op", max_length=column_length("EntityOp", "op"), kind="operation name")
    definition.method(definition.cls, op)
    if op_id is None:
        op_id = uuid.uuid4().hex
    else:
        guards.text(op_id, "op_id", max_length=column_length("EntityOp", "op_id"))
    payload = guards.plain_json(
        arg, f"the argument of entity {name!r} op {op!r}", max_bytes=conf.get().MAX_PAYLOAD_BYTES
    )
    entity_ops.send(name, key, op, payload, op_id)
    return op_id


def entity_state(name: str, key: str) -> Any:
    """The state of entity (``name``, ``key``) after its last applied op; its initial state if
    no op was applied yet."""
    from .engine import entity_ops

    _check(name, key)
    return entity_ops.state(name, key)


def _check(name: Any, key: Any) -> None:
    guards.text(name, "name", max_length=column_length("Entity", "name"), kind="entity name")
    guards.text(key, "key", max_length=column_length("Entity", "key"), kind="key")
