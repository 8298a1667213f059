"""Codecs for payloads at rest: bytes in, bytes out (compression, encryption), and the envelope
a payload column holds once a codec wrapped its JSON. Pure: no Django (``conf`` builds them).

A codec is any object with ``encode(bytes) -> bytes`` and ``decode(bytes) -> bytes``; a list of
them applies in order on the way in and in reverse on the way out. A class whose ``uses_keys``
is true is built with ``DURABLE["CODEC_KEYS"]``; any other with no argument.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

from .errors import PayloadUndecodable

#: The envelope's marker: the key of the values' tags (``durable.values.TAG``), whose escaping
#: already keeps a user dict from ever looking like one, with a kind of its own.
ENVELOPE_TAG = "__durable__"
ENVELOPE_KIND = "encoded"
#: The kind of the envelope a column holds once its payload was written to storage instead
#: (``{"__durable__": "offloaded", "v": "<object name>", "n": <bytes>}``).
OFFLOADED_KIND = "offloaded"


class Codec(Protocol):
    def encode(self, data: bytes) -> bytes: ...

    def decode(self, data: bytes) -> bytes: ...


class Zlib:
    """Compress with zlib: large JSON payloads shrink to a fraction."""

    uses_keys = False

    def __init__(self, level: int = 6) -> None:
        self.level = level

    def encode(self, data: bytes) -> bytes:
        return zlib.compress(data, self.level)

    def decode(self, data: bytes) -> bytes:
        try:
            return zlib.decompress(data)
        except zlib.error as exc:
            raise PayloadUndecodable(f"a payload is not zlib data ({exc})") from None


class Fernet:
    """Encrypt with Fernet (AES-128-CBC and HMAC-SHA256, from ``cryptography``): the first key
    encrypts, every key decrypts, so a new key goes first and old rows stay readable until
    ``manage.py durable reencode`` rewrote them."""

    uses_keys = True

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        try:
            from cryptography.fernet import Fernet as OneKey
            from cryptography.fernet import MultiFernet
        except ImportError:
            raise ValueError(
                'durable.codecs.Fernet needs the "cryptography" package: pip install "durable[crypto]"'
            ) from None
        if isinstance(keys, (str, bytes)) or not keys:
            raise ValueError(
                'durable.codecs.Fernet needs DURABLE["CODEC_KEYS"], a list of keys (the first encrypts); '
                "make one with cryptography.fernet.Fernet.generate_key()"
            )
        built = []
        for index, key in enumerate(keys):
            try:
                built.append(OneKey(key))
            except (ValueError, TypeError, binascii.Error):
                raise ValueError(
                    f"CODEC_KEYS[{index}] is not a Fernet key (32 url-safe base64-encoded bytes); "
                    "make one with cryptography.fernet.Fernet.generate_key()"
                ) from None
        self._fernet = MultiFernet(built)

    def encode(self, data: bytes) -> bytes:
        return self._fernet.encrypt(data)

    def decode(self, data: bytes) -> bytes:
        from cryptography.fernet import InvalidToken

        try:
            return self._fernet.decrypt(data)
        except InvalidToken:
            raise PayloadUndecodable(
                "no key of CODEC_KEYS decrypts a payload: put the key it was written under back in "
                'DURABLE["CODEC_KEYS"] (after the first)'
            ) from None


class Chain:
    """Codecs applied in order when encoding and in reverse when decoding."""

    def __init__(self, codecs: Sequence[Codec]) -> None:
        self.codecs = tuple(codecs)

    def encode(self, data: bytes) -> bytes:
        for codec in self.codecs:
            data = codec.encode(data)
        return data

    def decode(self, data: bytes) -> bytes:
        for codec in reversed(self.codecs):
            data = codec.decode(data)
        return data


def build(classes: Sequence[type], keys: Sequence[str | bytes]) -> Chain:
    """The chain of ``classes``, each built with ``keys`` when it uses them; ``ValueError`` or
    ``TypeError`` from a class that refuses its arguments."""
    return Chain([cls(keys) if getattr(cls, "uses_keys", False) else cls() for cls in classes])


def seal(value: Any, codec: Codec) -> dict[str, str]:
    """The envelope a payload column holds for ``value`` (JSON) encoded by ``codec``."""
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return {ENVELOPE_TAG: ENVELOPE_KIND, "v": base64.b64encode(codec.encode(data)).decode("ascii")}


def is_sealed(stored: Any) -> bool:
    """Whether ``stored`` (a column's JSON) is an envelope rather than a plain payload."""
    return (
        type(stored) is dict
        and len(stored) == 2
        and stored.get(ENVELOPE_TAG) == ENVELOPE_KIND
        and isinstance(stored.get("v"), str)
    )


def unseal(stored: dict[str, str], codec: Codec | None) -> Any:
    """The JSON value an envelope holds; ``PayloadUndecodable`` when ``codec`` cannot open it."""
    if codec is None:
        raise PayloadUndecodable(
            'a payload was written under a codec and DURABLE["CODEC"] is not set: set it (and '
            "CODEC_KEYS) as it was when the payload was written"
        )
    try:
        data = base64.b64decode(stored["v"], validate=True)
    except (binascii.Error, ValueError):
        raise PayloadUndecodable("a payload envelope holds no valid base64") from None
    try:
        decoded = codec.decode(data)
        return json.loads(decoded)
    except PayloadUndecodable:
        raise
    except Exception as exc:  # noqa: BLE001 - a user codec's failure is the row's, said as such
        raise PayloadUndecodable(
            f"the configured codecs do not decode a payload ({type(exc).__name__}: {exc}); was it "
            'written under another DURABLE["CODEC"]?'
        ) from None


def sealed(value: Any, codec: Codec | None) -> Any:
    """``value`` as a message carries it: sealed in an envelope under ``codec``, as it is with
    none (so messages without a codec stay byte for byte what they were)."""
    return value if codec is None else seal(value, codec)


def opened(value: Any, codec: Codec | None) -> Any:
    """The payload a message's ``value`` holds: ``value`` itself unless it is an envelope;
    ``PayloadUndecodable`` when ``codec`` cannot open it (or none is set)."""
    return unseal(value, codec) if is_sealed(value) else value


def reference(name: str, size: int) -> dict[str, Any]:
    """The envelope a payload column holds for a payload written to storage as object ``name``."""
    return {ENVELOPE_TAG: OFFLOADED_KIND, "v": name, "n": size}


def is_offloaded(stored: Any) -> bool:
    """Whether ``stored`` (a column's JSON) refers to a payload written to storage."""
    return (
        type(stored) is dict
        and len(stored) == 3
        and stored.get(ENVELOPE_TAG) == OFFLOADED_KIND
        and isinstance(stored.get("v"), str)
        and isinstance(stored.get("n"), int)
    )
