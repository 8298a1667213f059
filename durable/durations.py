"""Parse the duration forms users may write: timedelta, seconds, or "250ms"/"30s"/"5m"/"2h"/"3d"."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")

Duration = "timedelta | int | float | str"

#: The longest duration accepted. Durable adds durations to the current time (delays, deadlines,
#: timers, backoffs); anything near timedelta's own limit would overflow the date, and a wait of
#: more than a century is a mistake, not a plan.
MAX_DURATION = timedelta(days=36500)


def parse_duration(value: object, *, what: str = "duration") -> timedelta:
    """Return ``value`` as a timedelta, or raise ValueError saying what forms are accepted."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, bool):
        raise ValueError(f"{what}: expected a duration, got {value!r}")
    elif isinstance(value, (int, float)):
        result = _seconds(value, what)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if not match:
            raise ValueError(
                f'{what}: {value!r} is not a duration; write e.g. "250ms", "30s", "5m", "2h", '
                '"3d", a number of seconds or a timedelta'
            )
        result = _seconds(float(match.group(1)) * _UNITS[match.group(2)], what)
    else:
        raise ValueError(f"{what}: expected a duration, got {type(value).__name__}")
    if result < timedelta(0):
        raise ValueError(f"{what}: must not be negative, got {value!r}")
    if result > MAX_DURATION:
        raise ValueError(f"{what}: {value!r} is too long; at most {MAX_DURATION.days} days (100 years)")
    return result


def _seconds(seconds: float, what: str) -> timedelta:
    if not math.isfinite(seconds):
        raise ValueError(f"{what}: must be a finite duration, got {seconds!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(
            f"{what}: {seconds!r} seconds is too long; at most {MAX_DURATION.days} days (100 years)"
        ) from None


def optional_duration(value: object, *, what: str = "duration") -> timedelta | None:
    return None if value is None else parse_duration(value, what=what)
