"""Durable workflows for Django projects that already run Celery."""

from __future__ import annotations

from .api import (
    RunHandle,
    cancel,
    delete_run,
    get_run,
    publish_event,
    result,
    retry,
    signal,
    signal_with_start,
    start,
    update,
)
from .api_entities import entity_state, signal_entity
from .api_schedules import pause_schedule, resume_schedule, schedule, trigger_schedule
from .definitions import Retry, Schedule, Singleton, Step, Workflow, step, workflow
from .entities import entity
from .errors import (
    ApplicationError,
    ChildFailed,
    DurableError,
    GatherError,
    InvalidInput,
    NonDeterminismError,
    QueueFull,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunNotFound,
    StepFailed,
    UpdateRejected,
    WaitTimeout,
    WorkerLost,
    WorkflowNotRegistered,
)
from .inputs import DeadLetter, Failure
from .replay.composition import Deferred, Outcome
from .replay.context import Context
from .replay.stepscope import StepInfo, heartbeat, step_info

__all__ = [
    "ApplicationError",
    "ChildFailed",
    "Context",
    "DeadLetter",
    "Deferred",
    "DurableError",
    "Failure",
    "GatherError",
    "InvalidInput",
    "NonDeterminismError",
    "Outcome",
    "QueueFull",
    "Retry",
    "RunCancelled",
    "RunFailed",
    "RunFinished",
    "RunHandle",
    "RunNotFound",
    "Schedule",
    "Singleton",
    "Step",
    "StepFailed",
    "StepInfo",
    "UpdateRejected",
    "WaitTimeout",
    "WorkerLost",
    "Workflow",
    "WorkflowNotRegistered",
    "cancel",
    "delete_run",
    "entity",
    "entity_state",
    "get_run",
    "heartbeat",
    "pause_schedule",
    "publish_event",
    "result",
    "resume_schedule",
    "retry",
    "schedule",
    "signal",
    "signal_entity",
    "signal_with_start",
    "start",
    "step",
    "step_info",
    "trigger_schedule",
    "update",
    "workflow",
]
