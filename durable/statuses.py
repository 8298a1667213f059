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


class Attempted(StrEnum):
    """What a step attempt's message, or a result reported for it, came to (its task's result)."""

    COMPLETED = "completed"
    FAILED = "failed"
    #: Running on this process's event loop (an ``async def`` step): its result is written when it ends.
    STARTED = "started"
    #: The step raised CompleteLater: open, unheld, until ``complete_step`` settles it.
    LATER = "later"
    #: In line for a slot of its concurrency limit, or over its rate limit: sent again later.
    WAITING = "waiting"
    #: Nothing done: no token, not the attempt it names any more, settled already, another namespace's.
    STALE = "stale"
    #: Taken for this process by a turn but not started here: its hold lapses, and it counts as lost.
    UNSTARTED = "unstarted"
    #: Run, but the database never took its result: its hold lapses, and it counts as lost.
    UNRECORDED = "unrecorded"
    #: A failure reported where durable has no database, sent on to a worker that has.
    FORWARDED = "forwarded"


class Turned(StrEnum):
    """What a turn's message came to when the turn decided nothing for its run (``Decided``)."""

    #: Another turn holds the run's lease, or it was woken again too often while this one ran.
    BUSY = "busy"
    #: The run belongs to another namespace than this worker's.
    FOREIGN = "foreign"
    #: The turn lost its lease (taken over, or its run ended meanwhile): nothing of it written.
    LOST = "lost"
    #: This worker lacks the run's workflow version (a rolling deploy): left for one that has it.
    PARKED = "parked"
    #: Its body asked for other than its history holds (ON_NONDETERMINISM "park"): the run waits,
    #: unchanged, for code that replays it.
    BLOCKED = "blocked"
    #: Sent to a remote worker, which replays it and sends its decision back.
    REMOTE = "remote"
    #: A remote turn's decision that is not the lease holder's (a copy, a takeover, a forgery).
    REFUSED = "refused"
    #: A remote turn's decision that a wake overtook: the turn runs again.
    RERUN = "rerun"


#: Every move of a run's status, with the row statements (``durable/models/``) that make it. A
#: statement that moves a run between two statuses not named here is a bug: the test suite's
#: database refuses it (``tests/transitions.py`` installs these tables as triggers), and
#: ``tests/unit/test_transitions.py`` keeps the statement names true.
RUN_MOVES: dict[tuple[RunStatus, RunStatus], tuple[str, ...]] = {
    # A turn takes the lease (a run still running was taken over from a turn that died).
    (RunStatus.PENDING, RunStatus.RUNNING): ("claim", "wake_and_claim"),
    (RunStatus.SUSPENDED, RunStatus.RUNNING): ("claim", "wake_and_claim"),
    # A first turn replayed ahead of any claim settles its run with the step it starts.
    (RunStatus.PENDING, RunStatus.SUSPENDED): ("settle_first", "settle_first_holding"),
    # A turn ends: it settles its run, gives the lease back, or parks it on non-determinism.
    (RunStatus.RUNNING, RunStatus.SUSPENDED): ("settle", "release", "park", "take_orphans"),
    (RunStatus.RUNNING, RunStatus.COMPLETED): ("settle",),
    (RunStatus.RUNNING, RunStatus.FAILED): ("settle",),
    (RunStatus.RUNNING, RunStatus.CANCELLED): ("settle", "end"),
    # A step's result settles a resting run with no turn of its own (the write ahead).
    (RunStatus.SUSPENDED, RunStatus.COMPLETED): ("complete_and_settle",),
    (RunStatus.SUSPENDED, RunStatus.FAILED): ("complete_and_settle",),
    (RunStatus.SUSPENDED, RunStatus.CANCELLED): ("complete_and_settle", "end"),
    # Ended from outside its turns: cancelled, or dead once its recovery budget is spent.
    (RunStatus.PENDING, RunStatus.CANCELLED): ("end",),
    (RunStatus.PENDING, RunStatus.DEAD): ("end",),
    (RunStatus.RUNNING, RunStatus.DEAD): ("end", "take_orphans"),
    (RunStatus.SUSPENDED, RunStatus.DEAD): ("end",),
    # retry(): back in line.
    (RunStatus.FAILED, RunStatus.PENDING): ("reopen",),
    (RunStatus.DEAD, RunStatus.PENDING): ("reopen",),
    (RunStatus.CANCELLED, RunStatus.PENDING): ("reopen",),
}

#: Every move of a recorded position's status, with the row statements that make it.
CHECKPOINT_MOVES: dict[tuple[CheckpointStatus, CheckpointStatus], tuple[str, ...]] = {
    (CheckpointStatus.PENDING, CheckpointStatus.COMPLETED): (
        "complete",
        "complete_and_wake",
        "complete_and_settle",
        "settle_child",
        "settle_entity_call",
        "rewrite",
    ),
    (CheckpointStatus.PENDING, CheckpointStatus.FAILED): (
        "fail",
        "settle_child",
        "settle_entity_call",
        "rewrite",
    ),
    # retry() of a run whose child failed: the child's position waits for it again.
    (CheckpointStatus.FAILED, CheckpointStatus.PENDING): ("reattempt",),
}
