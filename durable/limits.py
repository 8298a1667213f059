"""Fleet-wide limits declared on steps and workflows: ``Concurrency`` and ``rate_limit``.

Vocabulary only: parsed and checked at declaration, enforced by ``durable.engine.flow``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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
        try:
            if callable(self.key):
                key = self.key(*args, **kwargs)
            else:
                key = self.key.format(*args, **{**_named(fn, args, kwargs), **kwargs})
        except Exception as exc:  # noqa: BLE001 - whatever the template or the callable raised
            raise InvalidInput(
                f"the concurrency key {self.key!r} could not be made from the arguments: {exc!r}"
            ) from None
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"the concurrency key must be a non-empty string, got {key!r}")
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
