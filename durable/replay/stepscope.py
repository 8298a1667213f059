"""What a step body can ask while it runs: ``durable.step_info()`` and ``durable.heartbeat()``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..definitions import body_scope
from ..errors import DurableError, InvalidInput


@dataclass(frozen=True)
class StepInfo:
    """The facts of the step attempt running now: its run, position (``seq``), attempt and name."""

    run_id: str
    seq: int
    attempt: int
    name: str
    #: The attempt's secret (None in a local step, which cannot complete later).
    secret: str | None = field(default=None, repr=False, compare=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across the attempts of one step of one run: pass it to the side effect."""
        return f"{self.run_id}:{self.seq}"

    @property
    def token(self) -> str:
        """What ``durable.complete_step`` settles this attempt with, after the step raised
        ``durable.CompleteLater``: it names the attempt and carries its secret."""
        if self.secret is None:
            raise DurableError(
                f"step {self.name!r} has no completion token: a local step cannot complete later "
                "(drop local=True)"
            )
        return f"{self.seq}.{self.attempt}.{self.secret}.{self.run_id}"


def parse_token(token: object) -> tuple[str, int, int, str]:
    """(run id, seq, attempt, secret) of a completion token, or InvalidInput."""
    parts = token.split(".", 3) if isinstance(token, str) else []
    if len(parts) != 4 or not all(parts) or not parts[0].isdigit() or not parts[1].isdigit():
        raise InvalidInput(
            "not a completion token: pass durable.step_info().token as the step handed it over"
        )
    return parts[3], int(parts[0]), int(parts[1]), parts[2]


@dataclass
class _Scope:
    info: StepInfo
    beat: Callable[[Any], None]
    #: How many values the attempt wrote to streams (``durable.write_stream``).
    writes: int = 0


_current: ContextVar[_Scope | None] = ContextVar("durable_step", default=None)


@contextlib.contextmanager
def step_scope(info: StepInfo, beat: Callable[[Any], None]) -> Iterator[None]:
    token = _current.set(_Scope(info, beat))
    try:
        # A step's code is no workflow body, even run inside a turn: it may call step functions.
        with body_scope(None):
            yield
    finally:
        _current.reset(token)


def step_info() -> StepInfo:
    """Return the facts of the step attempt running now."""
    scope = _current.get()
    if scope is None:
        raise DurableError("durable.step_info() works only inside a step that durable runs")
    return scope.info


def next_write() -> tuple[StepInfo, int]:
    """The attempt running now and the index of its next stream write (counted from 0)."""
    scope = _current.get()
    if scope is None:
        raise DurableError(
            "durable.write_stream() works only inside a step that durable runs; in a workflow body, "
            "use ctx.write_stream()"
        )
    scope.writes += 1
    return scope.info, scope.writes - 1


#: Called by ``heartbeat()`` outside a step durable runs in this process: the Celery wiring sets
#: one that reports the beat as a ``durable.heartbeat`` message when the running Celery task is a
#: step attempt durable sent (a remote step, or a Celery task used as a step).
beat_elsewhere: Callable[[Any], None] | None = None


def heartbeat(progress: Any = None) -> None:
    """Tell durable this step is alive and, optionally, how far it got (JSON).

    Raises ``durable.StepCancelled`` once the step's run was cancelled with ``interrupt=True``
    (let it escape: the attempt fails with code ``cancelled``, not retried). Inside a Celery task
    that durable sent as a step (a remote step, or a task used as a step) it sends the beat as a
    ``durable.heartbeat`` message. Anywhere else (a plain call in a test) it does nothing.
    """
    scope = _current.get()
    if scope is not None:
        scope.beat(progress)
    elif beat_elsewhere is not None:
        beat_elsewhere(progress)
