"""The statuses of runs and checkpoints, spelled once.

Plain string enums, so every layer compares against them without importing the ORM;
``durable.models`` builds its ``TextChoices`` from them.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run is: waiting for a turn, in one, waiting for something, or finished."""

    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD = "dead"


UNFINISHED = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED)
#: A run in one of these never changes again, unless ``retry()`` reopens it.
TERMINAL = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.DEAD)


#: Kinds of the positions that wait for signals and updates sent to the run.
MESSAGE_WAITS = ("signal", "any_signal", "update", "message")
#: Those that receive updates as updates, which ``ctx.reply`` answers.
UPDATE_WAITS = ("update", "message")


class CheckpointStatus(StrEnum):
    """Where a recorded position is: waiting for its result, or settled one way or the other."""

    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"


class FlowState(StrEnum):
    """Where a step attempt stands under a fleet-wide limit (``concurrency``, ``rate_limit``)."""

    #: It holds one of its key's slots until it ends.
    HELD = "held"
    #: Sent but unstarted, in line for a slot: the attempt that frees one sends it.
    WAITING = "waiting"
    #: Sent but unstarted, over its rate limit: its run sends it again at its ``wake_at``.
    RATE = "rate"


class Decided(StrEnum):
    """What a turn decided for its run: an end, a wait, or a successor (continue-as-new)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"
    CONTINUED = "continued"
