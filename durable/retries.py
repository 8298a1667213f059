"""How a failed step attempt is retried: ``durable.Retry``."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .durations import parse_duration
from .errors import ApplicationError, InvalidInput


@dataclass(frozen=True)
class Retry:
    """How a failed step attempt is retried; the wait is a durable timer.

    ``max_attempts=None`` retries without end: only the run's ``timeout`` (when it has one), a
    non-retryable error or a cancel stops it.
    """

    max_attempts: int | None = 3
    initial: Any = "1s"
    backoff: float = 2.0
    maximum: Any = "5m"
    non_retryable: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts is None:
            pass
        elif isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise InvalidInput(
                f"Retry(max_attempts=...) must be an int, or None to retry without end, got {self.max_attempts!r}"
            )
        elif self.max_attempts < 1:
            raise InvalidInput("Retry(max_attempts=...) counts the first attempt: use 1 or more")
        if isinstance(self.backoff, bool) or not isinstance(self.backoff, (int, float)) or self.backoff < 1:
            raise InvalidInput(f"Retry(backoff=...) must be a number >= 1, got {self.backoff!r}")
        try:
            object.__setattr__(self, "initial", parse_duration(self.initial, what="Retry.initial"))
            object.__setattr__(self, "maximum", parse_duration(self.maximum, what="Retry.maximum"))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        entries = self.non_retryable
        if isinstance(entries, (str, type)):
            entries = (entries,)
        for entry in entries:
            if not (isinstance(entry, str) or (isinstance(entry, type) and issubclass(entry, BaseException))):
                raise InvalidInput(
                    f"Retry(non_retryable=...) lists exception classes or dotted names, got {entry!r}"
                )
        object.__setattr__(self, "non_retryable", tuple(entries))

    def allows_after(self, attempt: int) -> bool:
        """Whether another attempt may follow attempt ``attempt`` (always, without a maximum)."""
        return self.max_attempts is None or attempt < self.max_attempts

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> timedelta:
        """Return the wait before attempt ``attempt + 1``, with up to 20% jitter."""
        try:
            base = min(
                self.initial.total_seconds() * self.backoff ** (attempt - 1), self.maximum.total_seconds()
            )
        except OverflowError:  # a very late attempt of a long retry: the cap applies
            base = self.maximum.total_seconds()
        return timedelta(seconds=base * (1 + 0.2 * rand()))

    def is_retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, ApplicationError) and exc.non_retryable:
            return False
        for entry in self.non_retryable:
            if isinstance(entry, str):
                if any(_dotted(k) == entry or k.__name__ == entry for k in type(exc).__mro__):
                    return False
            elif isinstance(entry, type) and isinstance(exc, entry):
                return False
        return True


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
