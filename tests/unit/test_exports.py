"""Pin durable's public namespace: the documented names (docs/api/), nothing more, in a sorted ``__all__``."""

from __future__ import annotations

import importlib

import durable

PUBLIC = [
    "ApplicationError",
    "Cancelled",
    "ChildFailed",
    "CompleteLater",
    "Concurrency",
    "Lane",
    "Context",
    "DeadLetter",
    "Deferred",
    "DurableError",
    "ErrorCode",
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
    "Signal",
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
    "adebounce",
    "aget_run",
    "aquery",
    "aread_stream",
    "aresult",
    "aretry",
    "asignal",
    "asignal_with_start",
    "astart",
    "aupdate",
    "awrite_stream",
    "cancel",
    "complete_step",
    "delete_run",
    "entity",
    "entity_state",
    "fork",
    "debounce",
    "get_run",
    "heartbeat",
    "heartbeat_step",
    "metrics_view",
    "pause_schedule",
    "publish_event",
    "query",
    "read_stream",
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
    "write_stream",
]


def test_all_is_sorted() -> None:
    assert list(durable.__all__) == sorted(durable.__all__)


def test_all_has_no_duplicates() -> None:
    assert len(durable.__all__) == len(set(durable.__all__))


def test_all_is_exactly_the_public_names() -> None:
    assert set(durable.__all__) == set(PUBLIC)


def test_every_public_name_is_importable_from_the_package_root() -> None:
    module = importlib.import_module("durable")
    missing = [name for name in PUBLIC if not hasattr(module, name)]
    assert missing == []


def test_star_import_gives_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from durable import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC)
