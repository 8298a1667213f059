"""Durable's settings: one typed object built from ``settings.DURABLE``.

Nothing else in durable reads Django settings for durable's keys; ``durable.checks`` reports
the values this module refuses.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, get_type_hints

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import codecs, routing
from .durations import parse_duration
from .statuses import TERMINAL
from .values import accept_naive_datetimes

_MUST_BE_POSITIVE = {
    "LEASE",
    "RECONCILE_INTERVAL",
    "TIMER_SWEEP_INTERVAL",
    "ORPHAN_SWEEP_INTERVAL",
    "STEP_REDISPATCH_AFTER",
    "RETENTION_SWEEP_INTERVAL",
    "TURN_TIME_LIMIT",
    "ENTITY_SWEEP_INTERVAL",
    "PRESENCE_INTERVAL",
}
_POLICY_KEYS = {"statuses", "max_age", "max_count", "workflows"}
#: Keys whose bad value stops durable from loading rather than falling back to the default.
_NO_FALLBACK = ("CODEC", "CODEC_KEYS", "OFFLOAD_BYTES", "OFFLOAD_STORAGE")
#: The values ON_NONDETERMINISM takes.
NONDETERMINISM_CHOICES = ("park", "fail")


@dataclass(frozen=True)
class RetentionPolicy:
    """One RETENTION entry: finished root runs of ``statuses`` (and ``workflows``, if given)
    are deleted once older than ``max_age`` or beyond the newest ``max_count``."""

    statuses: tuple[str, ...] = TERMINAL
    max_age: timedelta | None = None
    max_count: int | None = None
    workflows: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    """The DURABLE settings with defaults applied and durations parsed."""

    DEFAULT_QUEUE: str = "durable"
    LEASE: timedelta = timedelta(seconds=30)
    RECONCILE_INTERVAL: timedelta = timedelta(minutes=5)
    MAX_RECOVERY_ATTEMPTS: int = 5
    TIMER_BATCH_SIZE: int = 500
    HEARTBEAT_PERSIST_THROTTLE: timedelta = timedelta(seconds=10)
    EVENT_BUFFER_TTL: timedelta = timedelta(days=7)
    RETENTION: list[RetentionPolicy] = field(default_factory=list)
    DEAD_LETTER_WORKFLOW: str | None = None
    INSTANCE_ID: str = ""
    NAMESPACE: str | None = None
    DATABASE: str = "default"
    #: The alias of the connection that listens for the notices of runs' ends (``result()``):
    #: None for ``DATABASE``; behind a pooler in transaction mode, one that reaches the same
    #: PostgreSQL database directly (LISTEN needs a session of its own).
    LISTEN_DATABASE: str | None = None
    #: The alias of a streaming replica of ``DATABASE`` that callers' reads go to (``get_run``,
    #: ``result`` polling, ``query``, the admin's lists, the CLI): None reads the primary.
    READ_DATABASE: str | None = None
    #: A replica whose replay lags the primary by more than this is not read: the primary is.
    READ_DATABASE_MAX_LAG: timedelta = timedelta(seconds=5)
    MAX_PAYLOAD_BYTES: int = 1024 * 1024
    #: How often beat runs the timer sweep; bounds how late a due timer fires.
    TIMER_SWEEP_INTERVAL: timedelta = timedelta(seconds=1)
    #: A timer a run waits on (a sleep, a retry's backoff, a wait's timeout) due within this also
    #: goes out as a Celery countdown on the run's advance, so it fires on time without waiting
    #: for beat (the sweep stays its safety net); "0s": none, every timer waits for the sweep.
    TIMER_HINT_WITHIN: timedelta = timedelta(minutes=1)
    #: How often beat looks for turns whose lease expired.
    ORPHAN_SWEEP_INTERVAL: timedelta = timedelta(seconds=5)
    #: A dispatched step not picked up by a worker within this is sent again (sooner when a
    #: later message of its queue was taken before it: its message was lost).
    STEP_REDISPATCH_AFTER: timedelta = timedelta(minutes=5)
    #: An attempt sent again this many times and still not taken fails (code
    #: ``redispatch_limit``): no worker consumes its queue.
    STEP_REDISPATCH_LIMIT: int = 10
    #: Slack past a step's timeout before the engine declares the attempt lost.
    STEP_TIMEOUT_GRACE: timedelta = timedelta(seconds=5)
    #: How often beat runs the retention sweep.
    RETENTION_SWEEP_INTERVAL: timedelta = timedelta(minutes=1)
    #: A worker that records a step result runs the next turn itself when it serves that queue.
    INLINE_NEXT_TURN: bool = True
    #: A turn runs a dispatched step it awaits itself, under its lease, when this worker consumes
    #: the step's queue (see docs/architecture.md, "Eager steps").
    EAGER_STEPS: bool = True
    #: In a process that serves no queue, the first turn of a run started outside a transaction
    #: is published by a thread of the process, close starts together (``publish_behind``);
    #: False publishes it in the caller, before ``start()`` returns.
    PUBLISH_IN_THREAD: bool = True
    #: The most async step attempts one worker process runs at once on its loop (its tasks
    #: wait for a slot past that).
    ASYNC_STEPS_PER_PROCESS: int = 100
    #: A worker moves what it built at its start (Django, the project's modules, durable's
    #: registries) out of the garbage collector's sight (``gc.freeze()``), before its pool
    #: forks and again in each pool process: a full collection no longer walks it, and a prefork
    #: child no longer copies the pages it shares with its parent by touching them.
    FREEZE_GC_AT_START: bool = True
    #: A turn still running after this is stopped, its run handed back and counted as crashed
    #: (towards MAX_RECOVERY_ATTEMPTS): a body that never reaches a primitive cannot hold a
    #: worker process forever.
    TURN_TIME_LIMIT: timedelta = timedelta(minutes=15)
    #: How often beat runs the entity sweep, which prompts again the ops pending for longer.
    ENTITY_SWEEP_INTERVAL: timedelta = timedelta(seconds=5)
    #: Settled ops kept per entity key (the newest); older ones are deleted as new ones apply.
    ENTITY_OPS_KEPT: int = 1000
    #: How often a worker notes in the database that it is alive (its queues and workflows);
    #: one missed for three intervals counts as gone on the health page and in a run's diagnosis.
    PRESENCE_INTERVAL: timedelta = timedelta(seconds=15)
    #: Queues served by workers without database access (any language): every step sent to one
    #: is a remote step (see ``@durable.step(remote=True)``).
    REMOTE_QUEUES: tuple[str, ...] = ()
    #: What a turn does when the body asks for other than its history holds (a change of code,
    #: or a body that is not deterministic): "park" leaves the run suspended, retried with a
    #: backoff and at every worker start until code that replays it is deployed; "fail" ends it
    #: ``failed`` with the NonDeterminismError.
    ON_NONDETERMINISM: str = "park"
    #: The codecs every payload at rest goes through, as dotted paths applied in order
    #: (``"durable.codecs.Zlib"``, ``"durable.codecs.Fernet"``, a class of the project's); empty:
    #: payloads are stored as plain JSON. Declared as None, one path or a list of them.
    CODEC: tuple[str, ...] = ()
    #: The keys of a codec that uses keys (Fernet): the first encrypts, every one decrypts.
    CODEC_KEYS: tuple[str, ...] = ()
    #: A payload whose stored JSON (encoded, under a codec) is larger than this is written to
    #: OFFLOAD_STORAGE and its row keeps a reference (the claim check); None: never.
    OFFLOAD_BYTES: int | None = 256 * 1024
    #: The key of Django's STORAGES that offloaded payloads are written to.
    OFFLOAD_STORAGE: str = "default"
    #: The bearer token a scraper sends to ``durable.metrics_view`` (staff users need none);
    #: None: only staff may read the metrics.
    METRICS_TOKEN: str | None = None
    #: A folder every process of the host writes its metrics to, for durable.metrics_view to sum
    #: (each web and worker process of a host the same one); None: the view shows its own process's.
    METRICS_DIR: str | None = None


# The dataclass is the one place the keys and their defaults are written; a key's type says how
# its value is checked (a timedelta key takes a duration, an int key a whole number of at least 1).
_TYPES = get_type_hints(Settings)
KNOWN_KEYS = frozenset(_TYPES)
_DURATIONS = tuple(key for key, kind in _TYPES.items() if kind is timedelta)
_POSITIVE_INTS = tuple(key for key, kind in _TYPES.items() if kind is int)


def problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Return (key, message) for each bad value in ``raw``."""
    found: list[tuple[str, str]] = []
    setting = getattr(django_settings, "DURABLE", None)
    if setting is not None and not isinstance(setting, dict):
        return [("DURABLE", f"must be a dict of settings, got {type(setting).__name__}")]
    for key in sorted(set(raw) - KNOWN_KEYS):
        found.append((key, f"unknown key; known keys are {', '.join(sorted(KNOWN_KEYS))}"))
    for key in _DURATIONS:
        if key in raw:
            try:
                value = parse_duration(raw[key], what=key)
            except ValueError as exc:
                found.append((key, str(exc)))
                continue
            if key in _MUST_BE_POSITIVE and not value:
                found.append((key, "must be longer than zero"))
    for key in _POSITIVE_INTS:
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                found.append((key, f"must be a whole number of at least 1, got {value!r}"))
    for key in ("DEFAULT_QUEUE", "DATABASE"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            found.append((key, f"must be a non-empty string, got {raw[key]!r}"))
    for key in ("INSTANCE_ID", "NAMESPACE", "DEAD_LETTER_WORKFLOW"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            found.append((key, f"must be a string or None, got {raw[key]!r}"))
    for key in ("LISTEN_DATABASE", "READ_DATABASE"):
        alias = raw.get(key)
        if alias is not None and (not isinstance(alias, str) or alias not in django_settings.DATABASES):
            found.append((key, f"must be None or a key of DATABASES, got {alias!r}"))
    found.extend(_replica_problems(raw))
    if isinstance(raw.get("NAMESPACE"), str) and not routing.NAMESPACE.match(raw["NAMESPACE"]):
        found.append(
            (
                "NAMESPACE",
                f"may hold only letters, digits, '_' and '-' (it names queues), got {raw['NAMESPACE']!r}",
            )
        )
    if "ON_NONDETERMINISM" in raw and raw["ON_NONDETERMINISM"] not in NONDETERMINISM_CHOICES:
        found.append(
            (
                "ON_NONDETERMINISM",
                f'must be "park" (the default: the run waits for fixed code) or "fail" (the run '
                f"fails), got {raw['ON_NONDETERMINISM']!r}",
            )
        )
    for key in ("INLINE_NEXT_TURN", "EAGER_STEPS", "PUBLISH_IN_THREAD", "FREEZE_GC_AT_START"):
        if key in raw and not isinstance(raw[key], bool):
            found.append((key, f"must be True or False, got {raw[key]!r}"))
    queues = raw.get("REMOTE_QUEUES", ())
    if (
        isinstance(queues, str)
        or not isinstance(queues, (list, tuple))
        or not all(isinstance(q, str) and q for q in queues)
    ):
        found.append(("REMOTE_QUEUES", f'must be a list of queue names, e.g. ["gpu"], got {queues!r}'))
    if "RETENTION" in raw:
        found.extend(("RETENTION", message) for message in _retention_problems(raw["RETENTION"]))
    if isinstance(raw.get("DATABASE"), str) and raw["DATABASE"] not in django_settings.DATABASES:
        found.append(("DATABASE", f"{raw['DATABASE']!r} is not a key of DATABASES"))
    found.extend(_codec_problems(raw))
    found.extend(_offload_problems(raw))
    found.extend(_token_problems(raw))
    return found


def _replica_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """A replica is read only while its lag is known, and only PostgreSQL says its lag."""
    replica = raw.get("READ_DATABASE")
    if not isinstance(replica, str) or replica not in django_settings.DATABASES:
        return []
    primary = raw.get("DATABASE", "default")
    engines = {
        alias: django_settings.DATABASES.get(alias, {}).get("ENGINE", "") for alias in (primary, replica)
    }
    if any("postgresql" not in engine for engine in engines.values()):
        return [
            (
                "READ_DATABASE",
                f"a replica is read only on PostgreSQL (where its lag can be asked); {replica!r} and "
                f"{primary!r} use {engines[replica]!r} and {engines[primary]!r}",
            )
        ]
    return []


#: The shortest METRICS_TOKEN accepted: one a scraper could guess is no protection.
MIN_TOKEN_LENGTH = 24


def _token_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    token = raw.get("METRICS_TOKEN")
    found = []
    folder = raw.get("METRICS_DIR")
    if folder is not None and (not isinstance(folder, str) or not os.path.isdir(folder)):
        found.append(("METRICS_DIR", f"must be None or the path of an existing folder, got {folder!r}"))
    if token is None:
        return found
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH or token != token.strip() or " " in token:
        shown = f"{len(token)} characters" if isinstance(token, str) else type(token).__name__
        found.append(
            (
                "METRICS_TOKEN",
                f"must be None or a string of at least {MIN_TOKEN_LENGTH} characters without spaces "
                f"(e.g. secrets.token_urlsafe(32)), got {shown}",
            )
        )
    return found


def _offload_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    size = raw.get("OFFLOAD_BYTES")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        found.append(
            ("OFFLOAD_BYTES", f"must be a whole number of bytes of at least 1, or None (off), got {size!r}")
        )
    storage = raw.get("OFFLOAD_STORAGE", "default")
    if not isinstance(storage, str) or storage not in django_settings.STORAGES:
        found.append(
            (
                "OFFLOAD_STORAGE",
                f"{storage!r} is not a key of STORAGES (which has {', '.join(sorted(django_settings.STORAGES))}): "
                "name the storage large payloads are written to",
            )
        )
    return found


def _codec_paths(declared: Any) -> tuple[str, ...]:
    return () if declared is None else (declared,) if isinstance(declared, str) else tuple(declared)


def _codec_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with CODEC and CODEC_KEYS: a path that imports nothing, a class that is no
    codec, a codec that refuses the keys (Fernet without keys, or a key that is not one)."""
    declared, keys = raw.get("CODEC"), raw.get("CODEC_KEYS", ())
    if not (
        declared is None
        or (isinstance(declared, str) and declared)
        or (isinstance(declared, (list, tuple)) and all(isinstance(p, str) and p for p in declared))
    ):
        return [
            (
                "CODEC",
                'must be None, a dotted path such as "durable.codecs.Fernet", or a list of them '
                f"applied in order, got {declared!r}",
            )
        ]
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        return [("CODEC_KEYS", f"must be a list of keys (the first encrypts), got {type(keys).__name__}")]
    if not all(isinstance(key, (str, bytes)) for key in keys):
        return [("CODEC_KEYS", "must hold keys as text or bytes")]
    classes = []
    for path in _codec_paths(declared):
        try:
            cls = import_string(path)
        except ImportError as exc:
            return [("CODEC", f"cannot import {path!r}: {exc}")]
        if not (callable(getattr(cls, "encode", None)) and callable(getattr(cls, "decode", None))):
            return [
                ("CODEC", f"{path!r} is no codec: it needs encode(bytes) -> bytes and decode(bytes) -> bytes")
            ]
        classes.append(cls)
    try:
        codecs.build(classes, keys)
    except (ValueError, TypeError) as exc:
        return [("CODEC_KEYS" if "CODEC_KEYS" in str(exc) else "CODEC", str(exc))]
    return []


def _retention_problems(policies: Any) -> list[str]:
    if not isinstance(policies, (list, tuple)):
        return ['must be a list of policies, e.g. [{"statuses": ["completed"], "max_age": "30d"}]']
    found = []
    for i, policy in enumerate(policies):
        where = f"policy {i}"
        if not isinstance(policy, dict):
            found.append(f"{where} must be a dict, got {policy!r}")
            continue
        if set(policy) - _POLICY_KEYS:
            found.append(
                f"{where} has unknown keys {sorted(set(policy) - _POLICY_KEYS)}; known: {sorted(_POLICY_KEYS)}"
            )
        if policy.get("max_age") is None and policy.get("max_count") is None:
            found.append(f"{where} needs max_age, max_count or both")
        statuses = policy.get("statuses", TERMINAL)
        if (
            isinstance(statuses, str)
            or not isinstance(statuses, (list, tuple))
            or not set(statuses) <= set(TERMINAL)
        ):
            found.append(f"{where}: statuses must be a list of {', '.join(TERMINAL)}, got {statuses!r}")
        if policy.get("max_age") is not None:
            try:
                if not parse_duration(policy["max_age"], what="max_age"):
                    found.append(f"{where}: max_age must be longer than zero")
            except ValueError as exc:
                found.append(f"{where}: {exc}")
        count = policy.get("max_count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            found.append(f"{where}: max_count must be a whole number of at least 0, got {count!r}")
        workflows = policy.get("workflows", ())
        if isinstance(workflows, str) or not all(isinstance(w, str) for w in workflows):
            found.append(f"{where}: workflows must be a list of workflow names, got {workflows!r}")
    return found


def _policies(raw: list[dict[str, Any]]) -> list[RetentionPolicy]:
    return [
        RetentionPolicy(
            statuses=tuple(policy.get("statuses", TERMINAL)),
            max_age=None if policy.get("max_age") is None else parse_duration(policy["max_age"]),
            max_count=policy.get("max_count"),
            workflows=tuple(policy.get("workflows", ())),
        )
        for policy in raw
    ]


def declared() -> dict[str, Any]:
    """The DURABLE setting as declared (empty when unset or not a dict)."""
    raw = getattr(django_settings, "DURABLE", None) or {}
    return dict(raw) if isinstance(raw, dict) else {}


def default_instance_id() -> str:
    return os.environ.get("DURABLE_INSTANCE_ID") or f"{socket.gethostname()}:{os.getpid()}"


def load() -> Settings:
    """Build the settings; bad values fall back to defaults (the system checks report them)."""
    raw = declared()
    found = problems(raw)
    bad = {key for key, _ in found}
    values = {key: value for key, value in raw.items() if key in KNOWN_KEYS and key not in bad}
    for key in _DURATIONS:
        if key in values:
            values[key] = parse_duration(values[key])
    if "RETENTION" in values:
        values["RETENTION"] = _policies(values["RETENTION"])
    if "REMOTE_QUEUES" in values:
        values["REMOTE_QUEUES"] = tuple(values["REMOTE_QUEUES"])
    # Never a fallback: a codec that was asked for and is not applied would store in the clear,
    # and payloads written to a storage other than the one named would be where nobody looks.
    refused = [(key, message) for key, message in found if key in _NO_FALLBACK]
    if refused:
        raise ImproperlyConfigured("; ".join(f"DURABLE[{key!r}]: {message}" for key, message in refused))
    values["CODEC"] = _codec_paths(raw.get("CODEC"))
    values["CODEC_KEYS"] = tuple(raw.get("CODEC_KEYS", ()))
    values["INSTANCE_ID"] = values.get("INSTANCE_ID") or default_instance_id()
    return Settings(**values)


_cached: Settings | None = None
_codec: codecs.Chain | None = None


def get() -> Settings:
    """Return the current settings (rebuilt when tests override ``DURABLE``)."""
    global _cached, _codec
    if _cached is None:
        loaded = load()
        classes = [import_string(path) for path in loaded.CODEC]
        _codec = codecs.build(classes, loaded.CODEC_KEYS) if classes else None
        _cached = loaded
    return _cached


def codec() -> codecs.Chain | None:
    """The codecs payloads at rest go through (built once per settings), or None: plain JSON."""
    if _cached is None:
        get()
    return _codec


def first_key_codec() -> codecs.Chain | None:
    """The codecs with the first of CODEC_KEYS alone: what a payload decodes with once it is
    written under the current key (``manage.py durable reencode`` asks)."""
    loaded = get()
    if not loaded.CODEC:
        return None
    return codecs.build([import_string(path) for path in loaded.CODEC], loaded.CODEC_KEYS[:1])


def reset(**_: Any) -> None:
    """Forget the settings (a setting changed); tell the value converter Django's USE_TZ, which
    decides whether a naive datetime may cross a durable boundary."""
    global _cached, _codec
    _cached = None
    _codec = None
    accept_naive_datetimes(not django_settings.USE_TZ)
