"""Inputs durable gives the workflows it starts on a run's behalf (dead-letter handlers)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DeadLetter:
    """The input of a dead-letter workflow: the run that went ``dead`` and why.

    Stored as JSON; a handler declared with ``input_schema=durable.DeadLetter`` receives this
    object, otherwise the plain dict.
    """

    dead_run_id: str
    workflow: str
    input: Any
    error: dict[str, Any] | None

    @classmethod
    def model_validate(cls, value: Any) -> DeadLetter:
        return value if isinstance(value, cls) else cls(**value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Failure:
    """The input of an ``on_error`` handler workflow: the run that failed and its error."""

    run_id: str
    workflow: str
    input: Any
    error: dict[str, Any] | None

    @classmethod
    def model_validate(cls, value: Any) -> Failure:
        return value if isinstance(value, cls) else cls(**value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
