"""What a turn works on: the facts of its run, and the state it builds for the executor to
persist (pure data: the engine fills and writes it, the context changes it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ..definitions import Step
from .attempt import Result
from .history import ENTITY_OP, STREAM_CLOSE, STREAM_WRITE, BufferedSignal, ChildStart, Outgoing, Record


@dataclass(frozen=True)
class RunFacts:
    id: str
    workflow: str
    version: str
    namespace: str | None
    input: Any
    deadline: datetime | None = None
    #: Set by ``cancel(compensate=True)``: unwind instead of running the body; with
    #: ``interrupt``, ``Cancelled`` is raised in the body at its current wait instead.
    cancel_request: dict[str, Any] | None = None


class InPlaceRunner(Protocol):
    """Runs a dispatched step inside the turn (supplied by the executor; see ``engine.attempts``)."""

    def accepts(self, queue: str, step: Step) -> bool: ...

    def holder(self, queue: str, step: Step) -> str | None:
        """The name under which this process holds an attempt of ``step`` it starts itself once
        the turn commits, without a message, and runs beside the turn (an ``async def`` step on
        the worker's loop); None: sent."""
        ...

    def __call__(self, rec: Record, step: Step) -> Result: ...


class LocalLimits(Protocol):
    """Runs a ``local=True`` step that has a ``timeout`` or ``heartbeat_timeout`` under them, in
    the turn's thread (supplied by the executor; see ``engine.attempts``): ``StepTimeout`` is raised
    inside the step at the soft limit, and at the hard one the attempt, written as started before
    it runs, is recorded as timed out."""

    def __call__(self, rec: Record, step: Step) -> Result: ...


@dataclass
class TurnState:
    """Everything a turn changed, for the executor to persist."""

    records: dict[int, Record]
    #: Signals not yet consumed, oldest first; None until first needed (see ``load_signals``).
    signals: list[BufferedSignal] | None = None
    #: Loads ``signals`` on first use, so turns that wait for no signal skip the query.
    load_signals: Callable[[], list[BufferedSignal]] | None = None
    #: (id, payload) of the oldest event (name, match, since, excluding ids), or None.
    find_event: Callable[[str, dict[str, Any] | None, datetime, set[int]], tuple[int, Any] | None] | None = (
        None
    )
    dispatch: list[Record] = field(default_factory=list)
    wakes: list[datetime] = field(default_factory=list)
    #: Those of ``wakes`` that end a wait of the body (a sleep, a backoff, a timeout), not checks.
    timers: list[datetime] = field(default_factory=list)
    consumed: list[BufferedSignal] = field(default_factory=list)
    children: list[ChildStart] = field(default_factory=list)
    #: Messages to other runs recorded by this turn, sent in the transaction that writes them.
    outgoing: list[Outgoing] = field(default_factory=list)
    #: (workflow, status) of a run by id, or None if there is none (asked by ``ctx.signal``).
    find_run: Callable[[str], tuple[str, str] | None] | None = None
    #: The run's search attributes after an upsert recorded in this turn (None: unchanged).
    search_attributes: dict[str, Any] | None = None
    #: The run's exposed values (as stored when the turn began, then this turn's new exposes),
    #: and whether this turn exposed anything yet unwritten.
    exposed: dict[str, Any] = field(default_factory=dict)
    exposed_changed: bool = False
    #: Gate keys of the limit slots this turn freed (an attempt it counted lost, timed out, or
    #: ran in place to its end): the executor hands each on to the oldest attempt in its line.
    freed: list[str] = field(default_factory=list)
    #: The stream keys the body closed, in the replay so far: a write to one is refused.
    closed_streams: set[str] = field(default_factory=set)
    #: id(exception) -> positions whose failure it reports, to tell retry() what ended the run.
    raised: dict[int, list[int]] = field(default_factory=dict)
    #: ``ctx.logger``'s records, held back when a list (a turn replayed ahead of its write: they
    #: are the run's only if the write is; see ``engine.result_and_turn``); None: logged at once.
    logs: list[logging.LogRecord] | None = None
    #: False when ``records`` hold only what a turn changed (a remote turn's decision), not the
    #: whole history: what the history started is then asked of the database.
    whole_history: bool = True
    #: When ``records`` were read (a time taken before the read), or None for now. What they
    #: say of attempts running elsewhere (their beats, holds and takes) is true as of then only:
    #: a turn that stalls after its read (a loaded machine, a long step run in place) judges
    #: such an attempt silent, lost or unsent at that time, never at a later one it has not seen.
    read_at: datetime | None = None

    def buffered(self) -> list[BufferedSignal]:
        if self.signals is None:
            self.signals = self.load_signals() if self.load_signals is not None else []
        return self.signals

    def unsaved(self) -> list[Record]:
        return [r for r in self.records.values() if r.dirty or r.stored_as is None]

    def new_entity_ops(self) -> list[Record]:
        """The new positions that send an op to an entity with their first write."""
        return [r for r in self.records.values() if r.kind == ENTITY_OP and r.stored_as is None]

    def new_stream_writes(self) -> list[Record]:
        """The new positions that write to or close a stream with their first write."""
        return [
            r for r in self.records.values() if r.kind in (STREAM_WRITE, STREAM_CLOSE) and r.stored_as is None
        ]
