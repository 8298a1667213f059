"""How a turn stops, for the replay context: sticky suspension, one thread, the engine's stop.

Pure like the rest of the replay core: no ORM, no Celery. ``ended()`` tells replay() how a body
that stopped at a primitive ends, whatever it did after.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..errors import DurableError, ErrorCode, Suspend, _ControlFlow
from ..statuses import Decided
from .composition import ContinueAsNew
from .history import Decision
from .positions import Positions


class NotAhead(_ControlFlow):
    """A turn replayed ahead of its write reached what only a turn holding the run may do."""


class Stopping(Positions):
    """Suspension is sticky: once the turn decided to stop (a primitive that cannot answer yet,
    continue_as_new, a lost lease, a flush that lost a race, a change of code, a primitive
    misused), a body that catches the exception, returns from ``finally`` or calls more
    primitives changes nothing: every later primitive raises again before it records, runs,
    sends or flushes anything, and replay() reports the first stop whatever the body did after.
    """

    #: The engine's word that the turn must stop (its lease is gone, it ran too long): the
    #: exception to raise at the next primitive, or None. In-memory, so cheap to ask often.
    _stopped: Callable[[], BaseException | None] | None
    #: Why this turn stopped, once it has: nothing the body does afterwards records anything.
    _stopping: BaseException | None
    #: The thread running the body: the only one whose primitives are answered.
    _thread: int

    def _init_stopping(
        self, stopped: Callable[[], BaseException | None] | None, *, ahead: bool = False
    ) -> None:
        self._stopped = stopped
        self._stopping = None
        self._thread = threading.get_ident()
        self._ahead = ahead

    def _before_local_step(self) -> None:
        """A turn replayed ahead of its write (``replay(ahead=True)``) stops before a local step
        would run: what a step does cannot be taken back if the write is refused."""
        if self._ahead:
            raise self._stop(NotAhead("a local step would run"))

    def _stop(self, reason: BaseException) -> BaseException:
        """Note why the turn stops (the first reason wins); return the exception to raise."""
        if self._stopping is None:
            self._stopping = reason
        return reason

    def _guard(self) -> None:
        """Refuse a primitive once the turn stopped, or from a thread other than the turn's."""
        if threading.get_ident() != self._thread:
            # Positions are handed out in call order, so a primitive racing from another thread
            # would make the history depend on scheduling: refused, and the run fails with it.
            raise self._stop(
                DurableError(
                    f"a workflow primitive of run {self._facts.id} was called from thread "
                    f"{threading.current_thread().name!r}, not the thread running the workflow body: call "
                    "ctx methods only from the body itself (use ctx.all / ctx.map for parallel steps)",
                    code=ErrorCode.WRONG_THREAD,
                )
            )
        if self._stopping is not None:
            raise Suspend() if isinstance(self._stopping, Suspend) else self._stopping

    def _sticky(self, callback: Callable[..., None]) -> Callable[..., None]:
        """Wrap an engine callback so the control flow it raises (lease lost, stale) sticks."""

        def call(*args: Any) -> None:
            try:
                callback(*args)
            except _ControlFlow as stop:
                self._stop(stop)
                raise

        return call


def ended(ctx: Stopping, escaped: BaseException | None) -> Decision | None:
    """How a turn that stopped at a primitive (suspend, continue-as-new) ends, whatever the body
    did after; None if it did not stop there (it returned, or raised an error of its own).

    The engine's stops (lease gone, time limit, a write that lost a race) are raised on to it.
    """
    engine_stop = ctx._stopped() if ctx._stopped is not None else None
    for stop in (engine_stop, ctx._stopping, escaped):
        if isinstance(stop, _ControlFlow) and not isinstance(stop, (Suspend, ContinueAsNew)):
            raise stop
    stop = ctx._stopping or escaped
    if isinstance(stop, ContinueAsNew):
        return Decision(Decided.CONTINUED, next_input=stop.input)
    if not isinstance(stop, Suspend):
        return None
    now = ctx._now()
    wake_at = min(
        [*ctx._turn.wakes, now + ctx._limits.reconcile_interval, *filter(None, [ctx._facts.deadline])]
    )
    return Decision(Decided.SUSPENDED, wake_at=wake_at)
