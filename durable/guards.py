"""The checks every public call applies to what it is given, before anything is stored.

One vocabulary so each call refuses bad values the same way: ``InvalidInput`` whose message
starts with the field and says what to fix, and whose ``details["field"]`` names it.
"""

from __future__ import annotations

import inspect
import math
import reprlib
from collections.abc import Callable
from typing import Any

from . import routing
from .errors import InvalidInput, refuse
from .values import MAX_DEPTH, json_value

#: Run ids durable gives the runs it starts on a run's behalf; a caller may not take them.
DLQ_PREFIX = "dlq:"
ON_ERROR_PREFIX = "on_error:"
SCHEDULE_PREFIX = "schedule:"
RESERVED_PREFIXES = (DLQ_PREFIX, ON_ERROR_PREFIX, SCHEDULE_PREFIX)


class _Brief(reprlib.Repr):
    """How ``shown`` draws a value ``repr()`` cannot: a few levels deep, a few items wide, and an
    integer too long to convert to text by its number of digits."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 4, 40, 40

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:
            return f"<an integer of {_digits(x)} digits>"


_BRIEF = _Brief()


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut short: an error message never carries a whole oversized value, and
    showing a value nested thousands deep or an integer of thousands of digits never raises."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        text = _brief(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _brief(value: Any) -> str:
    try:
        return _BRIEF.repr(value)
    except (RecursionError, ValueError):
        return f"<a {type(value).__name__} that cannot be shown>"


def _digits(value: int) -> int:
    """About how many decimal digits ``value`` has (without converting it to a string)."""
    return int(abs(value).bit_length() * math.log10(2)) + 1


def text(value: Any, field: str, *, max_length: int, allow_empty: bool = False, kind: str = "string") -> str:
    """A string (non-empty unless ``allow_empty``) that fits a column of ``max_length``."""
    if not isinstance(value, str) or not (value or allow_empty):
        raise refuse(field, f"must be a {'' if allow_empty else 'non-empty '}{kind}, got {shown(value)}")
    if len(value) > max_length:
        raise refuse(field, f"is {len(value)} characters long; at most {max_length} fit")
    _storable(value, field)
    return value


def namespace(value: Any, *, max_length: int) -> str:
    """A namespace: letters, digits, ``_`` and ``-`` (it names queues), or empty for none."""
    text(value, "namespace", max_length=max_length, allow_empty=True)
    if not routing.NAMESPACE.match(value):
        raise refuse(
            "namespace", f"may hold only letters, digits, '_' and '-' (it names queues), got {shown(value)}"
        )
    return value


def _storable(value: str, field: str) -> None:
    if "\x00" in value:
        raise refuse(field, "must not contain NUL characters (\\x00); PostgreSQL cannot store them")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise refuse(
                field, "must not contain lone surrogates (e.g. \\ud800); it cannot be encoded as UTF-8"
            ) from None


def free_text(value: Any, field: str, *, max_bytes: int) -> str | None:
    """An optional string of any length up to ``max_bytes`` (UTF-8), storable in JSON."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise refuse(field, f"must be a string, got {shown(value)}")
    _storable(value, field)
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise refuse(field, f"is {size} bytes, over DURABLE['MAX_PAYLOAD_BYTES'] ({max_bytes})")
    return value


def run_id(value: Any, *, max_length: int, reserved_ok: bool = False) -> str:
    """A run id; one a caller picks may not start with a prefix durable keeps for itself."""
    value = text(value, "run_id", max_length=max_length)
    if not reserved_ok and value.startswith(RESERVED_PREFIXES):
        raise refuse(
            "run_id",
            f"{shown(value)} starts with a prefix durable keeps for the runs it starts itself "
            f"({', '.join(RESERVED_PREFIXES)}); pick another run_id",
        )
    return value


def tags(value: Any, *, max_bytes: int) -> list[str]:
    """A list (or tuple, set) of strings; None and a bare string are refused."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise refuse("tags", f'must be a list of strings such as ["vip"], got {shown(value)}')
    for tag in value:
        if not isinstance(tag, str):
            raise refuse("tags", f"must hold only strings, got {shown(tag)}")
        _storable(tag, "tags")
    json_value(list(value), "tags", max_bytes=max_bytes)
    return list(value)


def plain_json(value: Any, field: str, *, max_bytes: int | None = None) -> Any:
    """``json_value`` for a value stored as plain JSON and handed back to user code (an entity's
    argument, result and state): a tuple in it is refused, as it would read back as a list."""
    where = _tuple_at(value)
    if where is not None:
        at = f" at {where}" if where else ""
        raise refuse(
            f"{field}{at}",
            "is a tuple; it is stored as plain JSON, where a tuple reads back as a list: pass a list",
        )
    return json_value(value, field, max_bytes=max_bytes)


def _tuple_at(value: Any) -> str | None:
    """The path of the first tuple in ``value`` ("" for ``value`` itself), None when it holds
    none. Walked a level at a time and no deeper than json_value reads, which refuses the rest."""
    level: list[tuple[str, Any]] = [("", value)]
    for _ in range(MAX_DEPTH + 1):
        below: list[tuple[str, Any]] = []
        for path, node in level:
            if isinstance(node, tuple):
                return path
            if isinstance(node, list):
                below.extend((f"{path}[{i}]", item) for i, item in enumerate(node))
            elif isinstance(node, dict):
                below.extend((f"{path}.{key}" if path else str(key), item) for key, item in node.items())
        if not below:
            return None
        level = below
    return None


def step_function(func: Callable[..., Any]) -> None:
    """Accept a plain or an ``async def`` step; refuse an async generator, whose many values
    have no one output to record (collect them in the step and return a list)."""
    if inspect.isasyncgenfunction(func):
        raise InvalidInput(
            f"step {getattr(func, '__qualname__', func)!r} is an async generator, which has no one output "
            "to record: collect its values in the step and return them as a list"
        )


def not_async_generator(func: Callable[..., Any], what: str) -> None:
    """Refuse an ``async def`` that yields: a body returns its output once, and what it would
    yield between two turns has nowhere durable to go."""
    if inspect.isasyncgenfunction(func):
        raise InvalidInput(
            f"{what} {getattr(func, '__qualname__', func)!r} is an async generator (it yields): a "
            f"{what} returns its output once; write it as an async def that returns"
        )
