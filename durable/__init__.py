"""Durable workflows for Django projects that already run Celery."""

from __future__ import annotations

from .__about__ import __version__ as __version__
from .api import (
    RunHandle,
    cancel,
    complete_step,
    delete_run,
    get_run,
    heartbeat_step,
    publish_event,
    result,
    retry,
    signal,
    signal_with_start,
    start,
)
from .api_async import (
    acancel,
    aget_run,
    aquery,
    aresult,
    aretry,
    asignal,
    asignal_with_start,
    astart,
    aupdate,
)
from .api_entities import entity_state, signal_entity
from .api_schedules import pause_schedule, resume_schedule, schedule, trigger_schedule
from .api_updates import query, update
from .definitions import Retry, Schedule, Singleton, Step, Workflow, step, workflow
from .entities import entity
from .errors import (
    ApplicationError,
    Cancelled,
    ChildFailed,
    CompleteLater,
    DurableError,
    GatherError,
    InvalidInput,
    NonDeterminismError,
    QueueFull,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunNotFound,
    StepCancelled,
    StepFailed,
    StepTimeout,
    UpdateRejected,
    WaitTimeout,
    WorkerLost,
    WorkflowNotRegistered,
)
from .inputs import DeadLetter, Failure
from .limits import Concurrency
from .metrics.view import metrics_view
from .replay.composition import Deferred, Outcome
from .replay.context import Context
from .replay.stepscope import StepInfo, heartbeat, step_info
from .replay.updates import Update
from .values import register_converter, register_type

__all__ = [
    "ApplicationError",
    "Cancelled",
    "ChildFailed",
    "CompleteLater",
    "Concurrency",
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
    "StepCancelled",
    "StepFailed",
    "StepInfo",
    "StepTimeout",
    "Update",
    "UpdateRejected",
    "WaitTimeout",
    "WorkerLost",
    "Workflow",
    "WorkflowNotRegistered",
    "acancel",
    "aget_run",
    "aquery",
    "aresult",
    "aretry",
    "asignal",
    "asignal_with_start",
    "astart",
    "aupdate",
    "cancel",
    "complete_step",
    "delete_run",
    "entity",
    "entity_state",
    "get_run",
    "heartbeat",
    "heartbeat_step",
    "metrics_view",
    "pause_schedule",
    "publish_event",
    "query",
    "register_converter",
    "register_type",
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
