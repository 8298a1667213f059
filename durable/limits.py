"""Fleet-wide limits declared on steps and workflows: ``Concurrency``, ``rate_limit`` and ``Lane``.

Vocabulary only: parsed and checked at declaration, enforced by ``durable.engine.flow``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import guards
from .errors import InvalidInput
from .values import decode


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` in flight at once across every worker: attempts of a step (with ``key``,
    per key of the step's arguments) or runs of a workflow (``key`` over its input). ``key`` is a
    ``str.format`` template (``"{0}"``, ``"{customer}"``) or a callable taking the same arguments."""

    limit: int
    key: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise InvalidInput(
                f"Concurrency(limit=...) must be a whole number of at least 1, got {self.limit!r}"
            )
        if self.key is not None and not (callable(self.key) or (isinstance(self.key, str) and self.key)):
            raise InvalidInput(
                'Concurrency(key=...) is a template like "{0}" or "{customer}", or a callable of the '
                f"arguments, got {self.key!r}"
            )

    def key_for(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> str:
        """The key of a call of ``fn`` with these arguments ("" without ``key``); InvalidInput
        when the template or the callable cannot make one."""
        if self.key is None:
            return ""
        # Made from the arguments as the step receives them, not as stored (tagged).
        args, kwargs = decode(args), decode(kwargs)
        template = self.key
        if callable(template):
            return _made("concurrency", template, "arguments", lambda: template(*args, **kwargs))
        named = {**_named(fn, args, kwargs), **kwargs}
        return _made("concurrency", template, "arguments", lambda: template.format(*args, **named))


@dataclass(frozen=True)
class Singleton:
    """At most ``limit`` runs per key in flight; later ones wait ``pending`` (admitted by their
    ``priority``, then start order), and ``start()`` raises ``QueueFull`` once ``limit +
    max_queue_depth`` are unfinished. ``key`` is a callable of the input or a ``str.format``
    template over it (``"{customer_id}"``)."""

    key: Any
    limit: int = 1
    max_queue_depth: int | None = None

    def __post_init__(self) -> None:
        if not (callable(self.key) or (isinstance(self.key, str) and self.key)):
            raise InvalidInput(
                f'Singleton(key=...) is a callable of the input or a template like "{{customer_id}}", got {self.key!r}'
            )
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise InvalidInput(
                f"Singleton(limit=...) must be a whole number of at least 1, got {self.limit!r}"
            )
        depth = self.max_queue_depth
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
            raise InvalidInput(
                f"Singleton(max_queue_depth=...) must be None or a whole number, got {depth!r}"
            )

    def key_for(self, input: Any) -> str:
        """The key of a run with this input; a key that cannot be made is bad input."""
        input = decode(input)  # made from the input as the body receives it, not as stored
        template = self.key
        if callable(template):
            return _made("singleton", template, "input", lambda: template(input))
        if isinstance(input, dict):
            return _made("singleton", template, "input", lambda: template.format_map(input))
        return _made("singleton", template, "input", lambda: template.format(input))


def _made(kind: str, template: Any, source: str, make: Callable[[], Any]) -> str:
    """The key ``make`` returns from a call's ``source``; InvalidInput, naming ``template``, when
    it raises or makes no non-empty string."""
    try:
        key = make()
    except Exception as exc:  # noqa: BLE001 - whatever the template or the callable raised
        raise InvalidInput(
            f"the {kind} key {template!r} could not be made from the {source}: {exc!r}"
        ) from None
    if not isinstance(key, str) or not key:
        raise InvalidInput(f"the {kind} key must be a non-empty string, got {guards.shown(key)}")
    return key


def _named(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments by parameter name, so ``"{customer}"`` finds a positional ``customer``."""
    try:
        return dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {}


_PERIODS = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class Rate:
    """``rate_limit="100/m"`` parsed: at most ``count`` starts in any ``period``."""

    count: int
    period: timedelta

    @classmethod
    def parse(cls, value: Any, what: str) -> Rate | None:
        if value is None or isinstance(value, Rate):
            return value
        match = re.fullmatch(r"\s*(\d+)\s*/\s*([smh])\s*", value) if isinstance(value, str) else None
        if match is None or int(match.group(1)) < 1:
            raise InvalidInput(
                f'{what} is "<count>/<s|m|h>" with a count of at least 1, e.g. "100/m", got {value!r}'
            )
        return cls(int(match.group(1)), timedelta(seconds=_PERIODS[match.group(2)]))

    def __str__(self) -> str:
        unit = {1: "s", 60: "m", 3600: "h"}[int(self.period.total_seconds())]
        return f"{self.count}/{unit}"


def concurrency_option(value: Any, what: str) -> Concurrency | None:
    if value is None or isinstance(value, Concurrency):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise InvalidInput(f"{what} must be a whole number of at least 1, got {value!r}")
        return Concurrency(limit=value)
    raise InvalidInput(
        f"{what} takes a whole number or a durable.Concurrency(limit=..., key=...), got {value!r}"
    )


#: Every lane declared in this process, by name: two declarations of one name must agree.
_lanes: dict[str, Lane] = {}
#: What each lane holds in this process: "steps" or "runs" (one lane does not count both yet).
_members: dict[str, str] = {}


@dataclass(frozen=True)
class Lane:
    """A named admission line shared by every step that names it (``@durable.step(lane=...)``):
    at most ``concurrency`` of their attempts in flight and ``rate_limit`` starts per period
    across the fleet, per key when ``per_key`` is a template or a callable of each step's
    arguments (as ``Concurrency.key``). Its gates are the lane's, not any one step's.

    Or, named by workflows (``@durable.workflow(lane=...)``, ``durable.start(..., lane=...)``),
    by their runs: at most ``concurrency`` in flight (per key over the input), the others
    ``pending`` and admitted by ``priority``, then start order."""

    name: str
    concurrency: int | None = None
    rate_limit: Any = None
    per_key: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 100 or ":" in self.name:
            raise InvalidInput(
                f"Lane(name=...) must be a non-empty string of at most 100 characters without ':', got {self.name!r}"
            )
        if self.concurrency is not None:
            concurrency_option(self.concurrency, f"Lane {self.name!r} concurrency=")
        # Kept parsed: a lane compares equal to another declaration of the same limits.
        object.__setattr__(self, "rate_limit", Rate.parse(self.rate_limit, f"Lane {self.name!r} rate_limit="))
        if self.concurrency is None and self.rate_limit is None:
            raise InvalidInput(
                f"Lane {self.name!r} limits nothing: give it concurrency=, rate_limit= or both"
            )
        Concurrency(limit=1, key=self.per_key)  # the same check of the key as a step's

    @property
    def slots(self) -> Concurrency | None:
        """The concurrency limit of each step in the lane (per the lane's key)."""
        return None if self.concurrency is None else Concurrency(limit=self.concurrency, key=self.per_key)

    def key_for(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> str:
        """The lane's key for a call of ``fn`` ("" without ``per_key``)."""
        return Concurrency(limit=1, key=self.per_key).key_for(fn, args, kwargs)

    def line(self) -> Singleton:
        """The line the lane's runs wait in (the lane checked to hold runs)."""
        assert self.concurrency is not None
        return Singleton(key=self.per_key if self.per_key is not None else "*", limit=self.concurrency)


def lane_option(value: Any, what: str, member: str = "steps") -> Lane | None:
    """``lane=`` as declared for ``member`` ("steps" or "runs"): a ``durable.Lane``, the same as
    every other declaration of its name, holding members of one kind."""
    if value is None:
        return None
    if not isinstance(value, Lane):
        raise InvalidInput(
            f"{what} takes a durable.Lane(name, concurrency=..., rate_limit=...), got {value!r}"
        )
    if member == "runs" and (value.concurrency is None or value.rate_limit is not None):
        raise InvalidInput(
            f"{what}: runs wait in a lane for its concurrency slots, and lane {value.name!r} has "
            f"{'no concurrency=' if value.concurrency is None else 'a rate_limit='}, which bounds steps only: "
            "give the runs a lane with concurrency= and no rate_limit="
        )
    known = _lanes.get(value.name, value)
    if known != value:
        raise InvalidInput(
            f"lane {value.name!r} is declared twice with different limits ({known} and {value}): "
            "declare it once (a module-level durable.Lane) and name that object on each step"
        )
    held = _members.get(value.name, member)
    if held != member:
        raise InvalidInput(
            f"{what}: lane {value.name!r} holds {held} already; a lane holds steps or runs, not both "
            f"(their slots would be counted apart): give the {member} a lane of their own"
        )
    return value


def claim_lane(lane: Lane | None, member: str) -> None:
    """Note ``lane`` (checked by ``lane_option``) as holding ``member``, once the declaration
    that names it was accepted: a refused one claims nothing."""
    if lane is not None:
        _lanes.setdefault(lane.name, lane)
        _members.setdefault(lane.name, member)


def declared_lanes() -> list[tuple[Lane, str]]:
    """The lanes this process's steps and workflows name, by name, each with what it holds."""
    return [(lane, _members.get(name, "steps")) for name, lane in sorted(_lanes.items())]
