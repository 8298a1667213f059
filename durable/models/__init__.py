"""Durable's rows and their state transitions.

Every transition is one guarded UPDATE whose WHERE names the state it expects; the row count
says who won. Nothing outside this package assigns ``status``.
"""

from ..statuses import TERMINAL, UNFINISHED
from .base import RETRYABLE, Status, column_length
from .checkpoints import HELD, RATE, WAITING, Checkpoint, CheckpointQuerySet
from .cron import CronSchedule, CronScheduleQuerySet, SingletonSlot
from .entities import Entity, EntityOp, EntityOpQuerySet, EntityPrompt, EntityQuerySet, OpStatus
from .failures import AttemptError, AttemptErrorQuerySet
from .fans import Fan, FanQuerySet
from .flow import FlowGate, FlowStart, in_flight, in_line
from .messages import Event, EventQuerySet, Signal, SignalQuerySet
from .offloads import OffloadedPayload
from .presence import Presence, PresenceQuerySet
from .runs import FIRST_CLAIM, Claim, Run, RunQuerySet
from .streams import StreamHead, StreamValue

__all__ = [
    "FIRST_CLAIM",
    "HELD",
    "RATE",
    "RETRYABLE",
    "WAITING",
    "TERMINAL",
    "UNFINISHED",
    "AttemptError",
    "AttemptErrorQuerySet",
    "Checkpoint",
    "CheckpointQuerySet",
    "CronSchedule",
    "CronScheduleQuerySet",
    "Entity",
    "EntityOp",
    "EntityOpQuerySet",
    "EntityPrompt",
    "EntityQuerySet",
    "Event",
    "EventQuerySet",
    "Fan",
    "FanQuerySet",
    "OffloadedPayload",
    "OpStatus",
    "Presence",
    "PresenceQuerySet",
    "FlowGate",
    "FlowStart",
    "Claim",
    "Run",
    "RunQuerySet",
    "Signal",
    "SignalQuerySet",
    "SingletonSlot",
    "Status",
    "StreamHead",
    "StreamValue",
    "column_length",
    "in_flight",
    "in_line",
]
