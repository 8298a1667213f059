"""Values as annotations say: a step's parameter and return annotations and a workflow's input
and return annotations decide what the step, the body and the caller of ``durable.result``
receive (API.md §10, Values).

``values.decode`` already rebuilds what was stored tagged. What reaches a reader untagged (a
remote worker's plain JSON result, a caller's dict for a dataclass parameter, a row written
before the class was annotated) is shaped here by the annotation: a dict becomes the annotated
dataclass, NamedTuple or pydantic model (its fields shaped in turn), a string the annotated
``Decimal``, ``datetime``, ``UUID``... A value the annotation does not describe is handed on as
it is: the annotation is the reader's wish, never a reason to fail a run that the code could
still handle. Pure: no Django, no Celery.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import inspect
import types
import typing
import uuid
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

#: Nesting followed at most (a recursive annotation ends here).
MAX_DEPTH = 32

#: How a standard type is read from the plain JSON a value of it is written as.
_FROM_JSON: dict[type, Callable[[Any], Any]] = {
    Decimal: lambda v: Decimal(str(v)) if isinstance(v, (str, int, float)) else v,
    datetime: lambda v: datetime.fromisoformat(v) if isinstance(v, str) else v,
    date: lambda v: date.fromisoformat(v) if isinstance(v, str) else v,
    time: lambda v: time.fromisoformat(v) if isinstance(v, str) else v,
    timedelta: lambda v: (
        timedelta(seconds=v)
        if isinstance(v, (int, float)) and not isinstance(v, bool)
        else timedelta(days=v[0], seconds=v[1], microseconds=v[2])
        if isinstance(v, list) and len(v) == 3
        else v
    ),
    uuid.UUID: lambda v: uuid.UUID(v) if isinstance(v, str) else v,
    bytes: lambda v: base64.b64decode(v.encode("ascii"), validate=True) if isinstance(v, str) else v,
}


def shaped(value: Any, hint: Any, depth: int = 0) -> Any:
    """``value`` as annotation ``hint`` describes it, or ``value`` itself when it does not."""
    if hint is None or hint is Any or type(value) is hint or depth > MAX_DEPTH:
        return value  # the common case first: every read of every step's value passes here
    try:
        return _shaped(value, hint, depth)
    except Exception:  # noqa: BLE001 - the class refused it (a missing field, pydantic's check, its own __post_init__)
        return value


def _shaped(value: Any, hint: Any, depth: int) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return shaped(value, typing.get_args(hint)[0], depth + 1)
    if origin in (typing.Union, types.UnionType):
        return _one_of(value, typing.get_args(hint), depth)
    if origin is not None:
        return _container(value, origin, typing.get_args(hint), depth)
    if not isinstance(hint, type) or isinstance(value, hint):
        return value
    if hint in _FROM_JSON:
        return _FROM_JSON[hint](value)
    if issubclass(hint, enum.Enum):
        return hint(value)
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return hint(**_fields(value, _field_hints(hint), depth))
    if issubclass(hint, tuple) and hasattr(hint, "_fields") and isinstance(value, (dict, list)):
        named = value if isinstance(value, dict) else dict(zip(hint._fields, value, strict=False))
        return hint(**_fields(named, _field_hints(hint), depth))
    validate = getattr(hint, "model_validate", None)  # a pydantic model
    if callable(validate) and isinstance(value, dict):
        return validate(value)
    return value


def _one_of(value: Any, options: tuple[Any, ...], depth: int) -> Any:
    if value is None and type(None) in options:
        return None
    for option in options:
        if isinstance(option, type) and isinstance(value, option):
            return value
    for option in options:
        if option is type(None):
            continue
        got = shaped(value, option, depth + 1)
        if got is not value:
            return got
    return value


def _container(value: Any, origin: Any, args: tuple[Any, ...], depth: int) -> Any:
    if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple, set, frozenset)):
        if origin is tuple and args and args[-1] is not Ellipsis:
            items = [shaped(item, arg, depth + 1) for item, arg in zip(value, args, strict=False)]
        else:
            item_hint = args[0] if args else None
            items = [shaped(item, item_hint, depth + 1) for item in value]
        return origin(items)
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return {key: shaped(item, args[1], depth + 1) for key, item in value.items()}
    return value


def _fields(value: dict[str, Any], hints: dict[str, Any], depth: int) -> dict[str, Any]:
    return {key: shaped(item, hints.get(key), depth + 1) for key, item in value.items()}


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a forward reference that never resolves: fields as they are
        return {}


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a function's annotations say of its parameters and of its result."""

    parameters: inspect.Signature | None
    hints: dict[str, Any]

    @property
    def returns(self) -> Any:
        return self.hints.get("return")

    @functools.cached_property
    def positional(self) -> tuple[Any, ...] | None:
        """The annotations of the parameters positional arguments fill, in order; None when a
        ``*args`` or a keyword-only parameter makes that a question for ``bind_partial``."""
        if self.parameters is None:
            return None
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        found = list(self.parameters.parameters.values())
        if any(p.kind not in kinds for p in found):
            return None
        return tuple(self.hints.get(p.name) for p in found)

    def arguments(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """``args`` and ``kwargs`` shaped by the parameters they bind to."""
        if self.parameters is None or not self.hints:
            return args, kwargs
        hints = self.positional
        if hints is not None and not kwargs and len(args) <= len(hints):
            # The common call, every step's: no binding to do, and often nothing to shape.
            if all(type(v) is hint for v, hint in zip(args, hints, strict=False)):
                return args, kwargs
            return [shaped(v, hint) for v, hint in zip(args, hints, strict=False)], kwargs
        try:
            bound = self.parameters.bind_partial(*args, **kwargs)
        except TypeError:
            return args, kwargs  # the call itself fails, saying why, as it would have
        names = list(bound.arguments)
        positional = [shaped(v, self.hints.get(n)) for n, v in zip(names, args, strict=False)]
        named = {key: shaped(v, self.hints.get(key)) for key, v in kwargs.items()}
        return positional, named

    def parameter(self, index: int) -> Any:
        """The annotation of the ``index``-th parameter (a workflow body's input is the second)."""
        if self.parameters is None:
            return None
        names = list(self.parameters.parameters)
        return self.hints.get(names[index]) if index < len(names) else None


@functools.cache
def signature(fn: Callable[..., Any]) -> Signature:
    """``fn``'s annotations, resolved once (on first use: a forward reference may resolve only
    after the module that declares ``fn`` finished importing)."""
    try:
        parameters = inspect.signature(fn)
    except (TypeError, ValueError):
        parameters = None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a name that never resolves: no annotation to follow
        hints = {}
    return Signature(parameters, hints)
