"""Python values as tagged JSON and back: the one converter every durable boundary uses.

A value a row or a message cannot hold as plain JSON is written as a tag, a dict of two keys,
``{"__durable__": "decimal", "v": "12.34"}``, so it stays JSON (queryable) and comes back as the
same type with an equal value. Plain JSON goes through untouched, so rows stored before tags
existed read back as they were. Every stored value, tagged or plain, is also checked here once as
JSON a database keeps (``json_value``). Pure: no Django, no Celery (the engine tells it ``USE_TZ``).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import io
import json
import math
import re
import types
import typing
import uuid
from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from .errors import InvalidInput, refuse

#: Deepest nesting of lists and dicts a stored JSON value may have. Far below Python's recursion
#: limit, so a stored value can always be read back, even by code already deep in its stack.
MAX_DEPTH = 100

# A JSON "\u0000" escape, not a literal backslash before "u0000" (an escaped backslash is "\\").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

#: The key that marks a tagged value. A user dict that holds it is escaped (tag "dict").
TAG = "__durable__"

#: Whether a naive datetime is accepted: Django's ``USE_TZ = False`` (set by the app's config).
_naive_datetimes = False


def accept_naive_datetimes(accept: bool) -> None:
    """Accept naive datetimes (``USE_TZ = False``) or refuse them (``USE_TZ = True``, the default)."""
    global _naive_datetimes
    _naive_datetimes = bool(accept)


def encode(value: Any, *, what: str) -> Any:
    """``value`` as tagged JSON, or ``InvalidInput`` naming ``what`` and the path of the part that
    has no JSON form (``the input of workflow 'x' at order.items[2].price: ...``)."""
    kind = type(value)
    if kind is int or kind is str or kind is bool or value is None or _is_plain(value):
        return value  # the fast path: only containers are walked, nothing is copied
    return _encode(value, what, "")


def stored(value: Any, *, what: str, max_bytes: int | None = None) -> Any:
    """``value`` as a row or a message stores it: tagged JSON, refused (``InvalidInput`` naming
    ``what``) when a part has no JSON form or the whole is not JSON a database keeps (see
    ``json_value``: NUL characters, lone surrogates, too deep, more than ``max_bytes``).
    Every boundary that stores a value as tagged JSON calls this one function."""
    return json_value(encode(value, what=what), what, max_bytes=max_bytes)


def decode(data: Any) -> Any:
    """The value ``data`` (tagged JSON, as :func:`encode` made it) stands for; plain JSON is
    returned as it is (the same object)."""
    kind = type(data)
    if (kind is not dict and kind is not list) or not _has_tags(data):
        return data
    return _decode(data)


# -- the stored JSON ---------------------------------------------------------------------


def parse_json(text: str, field: str) -> Any:
    """``text`` read as JSON, for a value typed by a person (a command's argument, a form's
    field); ``InvalidInput`` naming ``field`` when it is not JSON, or JSON no call would store:
    nested deeper than MAX_DEPTH, or an integer too long to read."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise refuse(field, f"is nested deeper than {MAX_DEPTH} levels of lists and dicts") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise refuse(field, _LONG_INTEGER) from None
        raise refuse(field, f"is not JSON ({exc})") from None
    # Python 3.13's parser reads thousands of levels without a RecursionError where 3.11's
    # stops: the depth is checked here, so the refusal names the field on every version.
    if text.count("[") + text.count("{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise refuse(field, f"is nested deeper than {MAX_DEPTH} levels of lists and dicts")
    return value


#: What a value holding an integer too long for ``str()`` / ``int()`` (and so for JSON) is told.
_LONG_INTEGER = (
    "holds an integer too long to write as text (more than Python's sys.get_int_max_str_digits() "
    "digits); store it as a string"
)


def json_value(value: Any, field: str, *, max_bytes: int | None = None) -> Any:
    """Return ``value`` as it reads back from JSON once stored, or refuse it naming ``field``.

    Refused: what JSON cannot hold, NUL characters and lone surrogates anywhere (keys included),
    nesting deeper than MAX_DEPTH, and more than ``max_bytes`` bytes of UTF-8 when given.
    """
    try:
        encoded = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except RecursionError:
        raise refuse(field, f"is nested deeper than {MAX_DEPTH} levels of lists and dicts") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise refuse(field, _LONG_INTEGER) from None
        raise refuse(
            field, f"must be JSON-serialisable (dicts, lists, str, int, float, bool, None): {exc}"
        ) from None
    except TypeError as exc:
        raise refuse(
            field,
            f"must be JSON-serialisable (dicts, lists, str, int, float, bool, None): {exc}; it is "
            "stored as plain JSON, so convert it first (.model_dump(mode='json') of a pydantic "
            "model, dataclasses.asdict() of a dataclass, str() of a Decimal, .isoformat() of a datetime)",
        ) from None
    try:
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError:
        raise refuse(
            field, "must not contain lone surrogates (e.g. \\ud800); it cannot be encoded as UTF-8"
        ) from None
    if "\\u0000" in encoded and _NUL_ESCAPE.search(encoded):
        raise refuse(field, "must not contain NUL characters (\\x00); PostgreSQL cannot store them")
    if max_bytes is not None and size > max_bytes:
        raise refuse(
            field,
            f"is {size} bytes, over DURABLE['MAX_PAYLOAD_BYTES'] ({max_bytes}); store large data "
            "elsewhere and pass a reference",
        )
    loaded = json.loads(encoded)
    # Cheap first: fewer brackets than MAX_DEPTH cannot nest deeper than it.
    if encoded.count("[") + encoded.count("{") > MAX_DEPTH and _depth(loaded) > MAX_DEPTH:
        raise refuse(field, f"is nested deeper than {MAX_DEPTH} levels of lists and dicts")
    return loaded


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in node if isinstance(child, (dict, list)))
    return deepest


# -- encoding ----------------------------------------------------------------------------


def _is_plain(value: Any) -> bool:
    """True when ``value`` is JSON that needs no tag (exact types: a subclass takes the slow path).

    Walked a level at a time, so a value nested past MAX_DEPTH (or holding itself) is left to the
    slow path, which refuses it, instead of being walked forever."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH + 1:
            return False
        below: list[Any] = []
        for node in level:
            kind = type(node)
            if kind is str or kind is int or kind is bool or node is None:
                continue
            if kind is float:
                if not math.isfinite(node):
                    return False
                continue
            if kind is list:
                below.extend(node)
            elif kind is dict:
                for key in node:
                    if type(key) is not str or key == TAG:
                        return False
                below.extend(node.values())
            else:
                return False
        level = below
    return True


def _encode(value: Any, what: str, path: str, depth: int = 0) -> Any:
    kind = type(value)
    if kind in (str, int, bool) or value is None:
        return value
    if depth >= MAX_DEPTH and kind in (list, dict, tuple, set, frozenset):
        # Named by the field alone, as json_value refuses plain JSON nested too deep.
        raise InvalidInput(
            f"{what} is nested deeper than {MAX_DEPTH} levels of lists and dicts (or holds itself)",
            details={"field": what},
        )
    depth += 1
    if kind is float:
        if not math.isfinite(value):
            raise _refused(
                what, path, f"is the float {value!r}, which JSON cannot hold; pass None or a Decimal"
            )
        return value
    if kind is list:
        return [_encode(item, what, f"{path}[{i}]", depth) for i, item in enumerate(value)]
    if kind is dict:
        encoded = {}
        for key, item in value.items():
            name = _key(key, what, path)
            encoded[name] = _encode(item, what, _child(path, name), depth)
        return {TAG: "dict", "v": encoded} if TAG in encoded else encoded
    if kind is tuple:
        return {
            TAG: "tuple",
            "v": [_encode(item, what, f"{path}[{i}]", depth) for i, item in enumerate(value)],
        }
    if kind is set or kind is frozenset:
        items = [_encode(item, what, f"{path}[{i}]", depth) for i, item in enumerate(value)]
        # Sorted, so the same set is written the same way in every process (hashes are salted).
        items.sort(key=lambda item: json.dumps(item, sort_keys=True))
        return {TAG: "set" if kind is set else "frozenset", "v": items}
    converter = _BY_TYPE.get(kind)
    if converter is not None:
        return {TAG: converter.tag, "v": converter.encode(value, what, path)}
    registered = _REGISTERED.get(kind)
    if registered is not None:
        # What the user's encode returns may hold tagged types (a Decimal field) in its turn.
        return {TAG: registered.tag, "v": _encode(registered.to_json(value), what, path, depth)}
    return _plain_subclass(value, what, path)


def _plain_subclass(value: Any, what: str, path: str) -> Any:
    # A str / int / float subclass (StrEnum, IntEnum members) was written as its plain value
    # before tags existed; it still is, and comes back as the plain value.
    if isinstance(value, enum.Enum) and not isinstance(value, (str, int, float)):
        raise _refused(
            what,
            path,
            f"is the enum member {value!r}; pass its .value, or call "
            f"durable.register_type({type(value).__name__}) once at import",
        )
    if isinstance(value, (datetime, date)):
        # A subclass (freezegun's FakeDatetime under a frozen clock) is written as its base.
        # The converters, not the names datetime and date, which freezegun swaps in this module.
        converter = _STANDARD[0] if isinstance(value, datetime) else _STANDARD[1]
        return {TAG: converter.tag, "v": converter.encode(value, what, path)}
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _encode(float(value), what, path)
    raise _refused(what, path, _what_to_pass(value))


def _what_to_pass(value: Any) -> str:
    """Why ``value`` has no JSON form, and what to pass instead."""
    name = type(value).__name__
    if hasattr(type(value), "_meta") and hasattr(value, "pk"):
        return f"is a Django model instance ({name}); pass its pk ({value.pk!r}) and load it where it is used"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.LambdaType)):
        return f"is a function ({getattr(value, '__qualname__', name)}); pass the data it needs, not code"
    if isinstance(value, io.IOBase) or hasattr(value, "readinto"):
        return f"is a file ({name}); pass its path, or its content as bytes"
    register = f"or call durable.register_type({name}) once at import"
    if dataclasses.is_dataclass(value):
        return f"is a dataclass ({name}); pass dataclasses.asdict() of it, {register}"
    if callable(getattr(value, "model_dump", None)):
        return (
            f"is a pydantic model ({name}); pass .model_dump(mode='json') of it (a workflow or step "
            f"declared with input_schema={name} receives a {name} again), {register}"
        )
    if isinstance(value, tuple):
        return f"is a named tuple ({name}); pass ._asdict() of it or a plain tuple, {register}"
    return (
        f"is an instance of {name}, which has no JSON form; pass JSON (dict, list, str, int, float, bool, None) "
        "or datetime, date, time, timedelta, Decimal, UUID, bytes, tuple, set, frozenset, or teach "
        f"durable the type with durable.register_converter({name}, encode, decode)"
    )


def _key(key: Any, what: str, path: str) -> str:
    if type(key) is str:
        return key
    # json.dumps's own conversions of scalar keys, as stored before tags existed.
    if key is None or isinstance(key, (bool, int, float)) and not isinstance(key, enum.Enum):
        return json.dumps(key)
    raise _refused(what, path, f"has the key {key!r}; dict keys must be strings")


def _child(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _refused(what: str, path: str, problem: str) -> InvalidInput:
    field = f"{what} at {path}" if path else what
    return InvalidInput(f"{field} {problem}", details={"field": what, "path": path})


# -- the standard types --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Converter:
    tag: str
    encode: Callable[[Any, str, str], Any]
    decode: Callable[[Any], Any]


def _encode_datetime(value: datetime, what: str, path: str) -> str:
    if value.utcoffset() is None and not _naive_datetimes:
        raise _refused(
            what,
            path,
            f"is a naive datetime ({value.isoformat()}); pass an aware one "
            "(django.utils.timezone.now(), or .replace(tzinfo=...)): USE_TZ is True",
        )
    return value.isoformat()


def _encode_decimal(value: Decimal, what: str, path: str) -> str:
    if not value.is_finite():
        raise _refused(what, path, f"is Decimal({str(value)!r}); pass a finite Decimal or None")
    return str(value)


def _encode_timedelta(value: timedelta, what: str, path: str) -> list[int]:
    return [value.days, value.seconds, value.microseconds]


def _encode_bytes(value: bytes, what: str, path: str) -> str:
    return base64.b64encode(value).decode("ascii")


_STANDARD = (
    _Converter("datetime", _encode_datetime, datetime.fromisoformat),
    _Converter("date", lambda v, w, p: v.isoformat(), date.fromisoformat),
    _Converter("time", lambda v, w, p: v.isoformat(), time.fromisoformat),
    _Converter(
        "timedelta", _encode_timedelta, lambda v: timedelta(days=v[0], seconds=v[1], microseconds=v[2])
    ),
    _Converter("decimal", _encode_decimal, Decimal),
    _Converter("uuid", lambda v, w, p: str(v), uuid.UUID),
    _Converter("bytes", _encode_bytes, lambda v: base64.b64decode(v.encode("ascii"))),
)
_BY_TYPE: dict[type, _Converter] = {
    datetime: _STANDARD[0],
    date: _STANDARD[1],
    time: _STANDARD[2],
    timedelta: _STANDARD[3],
    Decimal: _STANDARD[4],
    uuid.UUID: _STANDARD[5],
    bytes: _STANDARD[6],
}
_BY_TAG: dict[str, Callable[[Any], Any]] = {
    **{converter.tag: converter.decode for converter in _STANDARD},
    "tuple": lambda v: tuple(_decode(item) for item in v),
    "set": lambda v: {_decode(item) for item in v},
    "frozenset": lambda v: frozenset(_decode(item) for item in v),
    "dict": lambda v: {key: _decode(item) for key, item in v.items()},
}


# -- decoding ----------------------------------------------------------------------------


def _has_tags(data: Any) -> bool:
    stack = [data]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is list:
            stack.extend(node)
        elif kind is dict:
            if TAG in node:
                return True
            stack.extend(node.values())
    return False


def _decode(data: Any) -> Any:
    kind = type(data)
    if kind is list:
        return [_decode(item) for item in data]
    if kind is not dict:
        return data
    if TAG in data and len(data) == 2 and "v" in data and data[TAG] in _BY_TAG:
        return _BY_TAG[data[TAG]](data["v"])
    # Not one of our tags (a dict stored before tags existed that happens to hold the key):
    # it reads back as it was written.
    return {key: _decode(item) for key, item in data.items()}


# -- registered types --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Registered:
    tag: str
    to_json: Callable[[Any], Any]
    from_json: Callable[[Any], Any]


#: Types registered by this process, by exact type and by tag. A tag read from a row finds only
#: a class registered here: a class is never imported by a name read from a row or a message.
_REGISTERED: dict[type, _Registered] = {}


def register_converter(
    cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], *, name: str | None = None
) -> None:
    """Teach durable a type: ``encode(value)`` returns what to store (JSON, or any type durable
    converts), ``decode(stored)`` the value again. Call it once at import, in every process that
    reads or writes the type (the web process, the workers): a row holding a type its reader did
    not register reads back as the tagged dict it is stored as.

    Stored as ``{"__durable__": name, "v": encode(value)}``; ``name`` defaults to the class's
    ``module.QualName`` and must stay the same for as long as rows hold it (rename the class,
    keep ``name``). Exact types only: a subclass needs its own registration.
    """
    if not isinstance(cls, type):
        raise InvalidInput(f"register_converter() needs a class, got {cls!r}")
    if not callable(encode) or not callable(decode):
        raise InvalidInput(f"register_converter({cls.__name__}, encode, decode) needs two functions")
    tag = name if name is not None else f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(tag, str) or not tag or tag in _BUILT_IN_TAGS:
        raise InvalidInput(
            f"register_converter({cls.__name__}) cannot use the name {tag!r}; pass another name="
        )
    if cls in _BY_TYPE or cls in (str, int, float, bool, list, dict, tuple, set, frozenset, type(None)):
        raise InvalidInput(f"durable converts {cls.__name__} already; it cannot be registered")
    taken = _BY_TAG.get(tag)
    previous = _REGISTERED.get(cls)
    if taken is not None and (previous is None or previous.tag != tag):
        raise InvalidInput(f"another type is registered under the name {tag!r}; pass another name=")
    if previous is not None:
        _BY_TAG.pop(previous.tag, None)
    registered = _Registered(tag, encode, decode)
    _REGISTERED[cls] = registered
    _BY_TAG[tag] = lambda v: registered.from_json(_decode(v))


def register_type(cls: type, *, name: str | None = None) -> type:
    """Make ``cls`` come back as itself wherever it crosses a durable boundary: an ``Enum`` (by
    its members' values), a dataclass or a ``NamedTuple`` (by its fields, which may hold any type
    durable converts), or a pydantic model (``model_dump(mode="json")`` / ``model_validate``).
    Returns ``cls``, so it works as a class decorator; ``name`` as for ``register_converter``."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        register_converter(cls, lambda member: member.value, cls, name=name)
    elif isinstance(cls, type) and dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
        register_converter(cls, lambda v: {n: getattr(v, n) for n in names}, lambda d: cls(**d), name=name)
    elif isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
        register_converter(cls, lambda v: dict(v._asdict()), lambda d: cls(**d), name=name)
    elif isinstance(cls, type) and callable(validate := getattr(cls, "model_validate", None)):
        register_converter(cls, lambda v: v.model_dump(mode="json"), validate, name=name)
    else:
        raise InvalidInput(
            f"register_type() takes an Enum, a dataclass, a NamedTuple or a pydantic model, got "
            f"{cls!r}; use durable.register_converter(cls, encode, decode) for other types"
        )
    return cls


_BUILT_IN_TAGS = frozenset(_BY_TAG)


# -- classes named by annotations ------------------------------------------------------------


def register_annotations(fn: Callable[..., Any]) -> None:
    """Register the classes ``fn``'s parameter and return annotations name (``def charge(order:
    Order) -> Receipt``), inside ``list[...]``, ``X | None`` and the fields of a dataclass or a
    named tuple too: an Enum, a dataclass, a NamedTuple or a pydantic model not registered yet.
    Called by ``@durable.step`` and ``@durable.workflow`` at import, so every process that knows
    the step knows its classes; an annotation that cannot be resolved then is left alone. Enums
    that are ``str`` or ``int`` keep their plain stored form (they stay queryable)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a forward reference or a local name: nothing to learn here
        return
    seen: set[int] = set()
    for hint in hints.values():
        _register_hint(hint, seen, 0)


def _register_hint(hint: Any, seen: set[int], depth: int) -> None:
    if depth > 8 or id(hint) in seen:
        return
    seen.add(id(hint))
    if not isinstance(hint, type):
        for arg in typing.get_args(hint):
            _register_hint(arg, seen, depth + 1)
        return
    if hint in _REGISTERED or hint in _BY_TYPE or not _registrable(hint):
        return
    try:
        register_type(hint)
    except InvalidInput:
        # Its name is another class's (one defined again under the same name): left unregistered,
        # it is refused where it is passed, saying to register it under a name of its own.
        return
    if dataclasses.is_dataclass(hint) or issubclass(hint, tuple):
        try:
            fields = typing.get_type_hints(hint)
        except Exception:  # noqa: BLE001 - as above
            return
        for field in fields.values():
            _register_hint(field, seen, depth + 1)


def _registrable(cls: type) -> bool:
    if issubclass(cls, enum.Enum):
        return not issubclass(cls, (str, int, float))
    return (
        dataclasses.is_dataclass(cls)
        or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
        or (callable(getattr(cls, "model_validate", None)) and callable(getattr(cls, "model_dump", None)))
    )
