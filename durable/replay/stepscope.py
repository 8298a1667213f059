"""What a step body can ask while it runs: ``durable.step_info()`` and ``durable.heartbeat()``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ..errors import DurableError


@dataclass(frozen=True)
class StepInfo:
    """The facts of the step attempt running now: its run, position (``seq``), attempt and name."""

    run_id: str
    seq: int
    attempt: int
    name: str

    @property
    def idempotency_key(self) -> str:
        """Stable across the attempts of one step of one run: pass it to the side effect."""
        return f"{self.run_id}:{self.seq}"


@dataclass
class _Scope:
    info: StepInfo
    beat: Callable[[Any], None]


_current: ContextVar[_Scope | None] = ContextVar("durable_step", default=None)


@contextlib.contextmanager
def step_scope(info: StepInfo, beat: Callable[[Any], None]) -> Iterator[None]:
    token = _current.set(_Scope(info, beat))
    try:
        yield
    finally:
        _current.reset(token)


def step_info() -> StepInfo:
    """Return the facts of the step attempt running now."""
    scope = _current.get()
    if scope is None:
        raise DurableError("durable.step_info() works only inside a step that durable runs")
    return scope.info


def heartbeat(progress: Any = None) -> None:
    """Tell durable this step is alive and, optionally, how far it got (JSON).

    Raises ``durable.StepCancelled`` once the step's run was cancelled with ``interrupt=True``
    (let it escape: the attempt fails with code ``cancelled``, not retried). Outside a step run
    by durable (a plain call in a test) it does nothing.
    """
    scope = _current.get()
    if scope is not None:
        scope.beat(progress)
