"""Plain records of a run's history and of what a turn decided: the pure core's data.

Nothing here imports the ORM or Celery; the turn executor converts rows to and from these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..statuses import CheckpointStatus, Decided

PENDING, COMPLETED, FAILED = CheckpointStatus.PENDING, CheckpointStatus.COMPLETED, CheckpointStatus.FAILED
#: Kinds of positions whose first write sends something beside their own row: an op to an
#: entity, a value to a stream, a stream's close.
ENTITY_OP, STREAM_WRITE, STREAM_CLOSE = "entity", "stream", "close_stream"


@dataclass
class Record:
    """One position of a run's history (a Checkpoint row)."""

    seq: int
    kind: str
    name: str
    status: str = PENDING
    attempt: int = 1
    input: Any = None
    output: Any = None
    error: dict[str, Any] | None = None
    wake_at: datetime | None = None
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    queue: str = ""
    #: First position of the fan this record belongs to, and whether its first failure resumes.
    fan: int | None = None
    fail_fast: bool = False
    #: The secret the last sent attempt's message carries (None: not sent, or sent before tokens).
    token: str | None = None
    #: Until when the process running a dispatched attempt holds it (None: not held).
    held_until: datetime | None = None
    #: The process holding it: set by a turn when that process starts the attempt itself, on its
    #: loop, without a message (``InPlaceRunner.holder``); by the take otherwise.
    held_by: str | None = None
    #: Under a fleet-wide limit: the attempt's ``FlowState`` (None: not held back) and gate key.
    flow: str | None = None
    flow_key: str | None = None
    #: How many times this attempt was sent again because its message was lost (or never taken).
    redispatches: int = 0
    #: (status, attempt) as stored; None while the row does not exist yet.
    stored_as: tuple[str, int] | None = None
    dirty: bool = False
    #: Attempts that failed during this turn, for the engine to file as AttemptError rows:
    #: {"attempt", "error", "traceback", "at"}.
    failures: list[dict[str, Any]] = field(default_factory=list)

    def changed(self) -> None:
        self.dirty = True


@dataclass
class BufferedSignal:
    id: int
    name: str
    payload: Any
    consumed_seq: int | None = None
    #: Sent by ``durable.update``: ``ctx.wait_for_update`` takes only these, a signal wait any.
    update: bool = False


@dataclass(frozen=True)
class Limits:
    """The settings the replay needs, passed in so the core never reads Django settings."""

    reconcile_interval: timedelta
    redispatch_after: timedelta
    timeout_grace: timedelta
    heartbeat_throttle: timedelta
    default_queue: str
    #: How far back a wait for an event looks (EVENT_BUFFER_TTL).
    event_ttl: timedelta = timedelta(days=7)
    #: The largest payload a run may send, reply or expose (MAX_PAYLOAD_BYTES).
    max_payload_bytes: int = 1024 * 1024
    #: Queues whose steps are remote (REMOTE_QUEUES).
    remote_queues: frozenset[str] = frozenset()
    #: How many times one attempt is sent again before it fails (STEP_REDISPATCH_LIMIT).
    redispatch_limit: int = 10
    #: A body that asks for other than its history holds parks its run (ON_NONDETERMINISM
    #: "park"): its turn ends ``blocked``, with nothing compensated; False fails the run.
    park_nondeterminism: bool = True
    #: A codec seals payloads (DURABLE["CODEC"]): no message may carry one in the clear, so a
    #: Celery task used as a step, which can only take plain arguments, is refused.
    sealed_payloads: bool = False
    #: How long a process holds an attempt before renewing it (LEASE).
    lease: timedelta = timedelta(seconds=30)


@dataclass
class Decision:
    """What a turn decided for the run (not ``durable.Outcome``, which is how a member of a fan ended)."""

    status: Decided
    output: Any = None
    error: dict[str, Any] | None = None
    wake_at: datetime | None = None
    failed_seqs: list[int] = field(default_factory=list)
    #: For ``continued``: the input of the run that continues this one.
    next_input: Any = None
    #: The body asked for other than its history holds and the limits say park: ``error`` says
    #: what; the engine writes nothing of the turn and parks the run until code that replays it.
    blocked: bool = False


@dataclass(frozen=True)
class ChildStart:
    """A child run the turn starts, in the same transaction as the position that waits for it."""

    run_id: str
    workflow: str
    version: str
    input: Any
    seq: int
    #: What the child becomes when its parent ends unfinished; None: "cancel", the default.
    on_parent_close: str | None = None


@dataclass(frozen=True)
class Outgoing:
    """A message a turn sends to other runs (``ctx.signal``, ``ctx.publish_event``, ``ctx.start``),
    written in the same transaction as the position that records it, so it goes once or not at all.
    """

    kind: str  # "signal" | "event" | "start"
    seq: int
    #: The target run's id (signal, start); empty for an event.
    run_id: str
    #: The signal's, the event's or the started workflow's name.
    name: str
    payload: Any
    #: For a start: the workflow's version and the namespace the new run takes.
    version: str | None = None
    namespace: str | None = None
