"""Inputs durable gives the workflows it starts on a run's behalf: dead-letter and on_error handlers.

Stored as JSON; a handler declared with ``input_schema=durable.DeadLetter`` (or ``Failure``)
receives the object, otherwise the plain dict.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="_HandlerInput")


class _HandlerInput:
    @classmethod
    def model_validate(cls: type[T], value: Any) -> T:
        return value if isinstance(value, cls) else cls(**value)

    def to_dict(self) -> dict[str, Any]:
        # Shallow: asdict() would turn a registered dataclass inside ``input`` into a dict.
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class DeadLetter(_HandlerInput):
    """The input of a dead-letter workflow: the run that went ``dead`` and why."""

    dead_run_id: str
    workflow: str
    input: Any
    error: dict[str, Any] | None


@dataclass(frozen=True)
class Failure(_HandlerInput):
    """The input of an ``on_error`` handler workflow: the run that failed and its error."""

    run_id: str
    workflow: str
    input: Any
    error: dict[str, Any] | None
