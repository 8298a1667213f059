"""The interface between ``Context`` and the primitives mixed into it (composition, saga, waits,
timers, search attributes, stopping): all they may use of the context, and nothing else of it.

The members are underscored so that a workflow body's view of ``ctx`` stays the public API.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..definitions import Step
from ..errors import DurableError
from ..routing import queue_in
from ..values import json_value, stored
from .history import PENDING, Limits, Record

if TYPE_CHECKING:
    from .turnstate import RunFacts, TurnState


class Pending:
    """A primitive that cannot answer yet; the run should wake by ``wake_at`` (None: no timer).

    ``timer``: whether ``wake_at`` is when the body's wait ends (a sleep, a backoff, a timeout)
    rather than a check that normally never fires (a step attempt's deadline): only a timer is
    worth a message of its own to fire on time (the engine's countdown hint)."""

    __slots__ = ("timer", "wake_at")

    def __init__(self, wake_at: datetime | None, *, timer: bool = True) -> None:
        self.wake_at = wake_at
        self.timer = timer


class Positions(ABC):
    """What a primitive needs of the context: the run's facts, the turn's state, the settings,
    the clock, the history's positions, and the step machinery that fans and compensations reuse.

    A primitive takes its position with ``_position`` (the record there, or None when it is new),
    records a new one with ``_new``, and hands its answer (a value, an error to raise, or a
    ``Pending``) to ``_settle``, which returns the value or stops the turn.
    """

    #: The run this turn advances.
    _facts: RunFacts
    #: What this turn changed so far, for the executor to persist.
    _turn: TurnState
    #: The settings the replay needs.
    _limits: Limits

    def _storable(self, value: Any, what: str, *, typed: bool = True) -> Any:
        """``value`` as it will be stored (tagged JSON, or plain JSON when not ``typed``: names and
        attributes kept for querying), refused with ``InvalidInput`` when it has no JSON form or
        is larger than MAX_PAYLOAD_BYTES."""
        limit = self._limits.max_payload_bytes
        return (
            stored(value, what=what, max_bytes=limit) if typed else json_value(value, what, max_bytes=limit)
        )

    def _queue_of(self, step: Step) -> str:
        """The queue an attempt of ``step`` goes to, in this run's namespace: none for a local
        step, Celery's own routing for a Celery task that names none."""
        if step.local:
            return ""
        queue = step.queue or ("" if step.celery_task else self._limits.default_queue)
        return queue_in(queue, self._facts.namespace)

    @abstractmethod
    def _now(self) -> datetime:
        """The engine's clock (never recorded: use it only to decide, not as a body's value)."""

    @property
    @abstractmethod
    def _here(self) -> int:
        """The position of the primitive being answered."""

    @property
    @abstractmethod
    def _next(self) -> int:
        """The position the next primitive will take."""

    @abstractmethod
    def _take(self, seq: int) -> None:
        """Make ``seq`` the position being answered, the next one after it."""

    @abstractmethod
    def _position(self, kind: str, name: str) -> Record | None:
        """Take the next position; return its record, checked against ``kind`` and ``name``."""

    @abstractmethod
    def _new(self, kind: str, name: str, *, status: str = PENDING, **fields: Any) -> Record:
        """Record a new entry at the position being answered."""

    @abstractmethod
    def _is_remote(self, step: Step) -> bool:
        """Whether an attempt of ``step`` runs on a remote worker (reported through the protocol)."""

    @abstractmethod
    def _settle(self, answer: Any) -> Any:
        """Return ``answer``, raise it if it is an exception, or stop the turn if it is pending."""

    @abstractmethod
    def _failure(self, exc: DurableError, rec: Record) -> DurableError:
        """Note that ``exc`` reports the failure at ``rec`` (for ``retry()``); return it."""

    @abstractmethod
    def _guard(self) -> None:
        """Refuse a primitive once the turn stopped, or from a thread other than the turn's."""

    @abstractmethod
    def _stop(self, reason: BaseException) -> BaseException:
        """Note why the turn stops (the first reason wins); return the exception to raise."""

    # -- steps, for fans and compensations -------------------------------------------------

    @abstractmethod
    def _step_definition(self, step: Any) -> Step:
        """The step ``ctx.step`` was given (a definition, a name or a Celery task)."""

    @abstractmethod
    def _definition_of(self, rec: Record) -> Step:
        """The step behind a recorded position."""

    @abstractmethod
    def _step_position(
        self,
        step: Step,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        fan: int | None,
        fail_fast: bool,
        send: bool = True,
    ) -> Record:
        """Take the position of a step, recording (and sending) it when new."""

    @abstractmethod
    def _resolve_step(self, rec: Record, step: Step) -> Any:
        """Answer for the step at ``rec`` as it stands now, running or sending it if due."""

    @abstractmethod
    def _send(self, rec: Record, step: Step) -> None:
        """Send an attempt of the step at ``rec`` to its queue once the turn commits."""
