"""Start and steer runs from views, shells and tasks.

Every call writes in the caller's transaction; the Celery messages it causes go out on commit.
"""

from __future__ import annotations

import functools
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction

from . import clock, conf, dispatch, guards
from .definitions import Workflow, registry
from .durations import parse_duration
from .errors import (
    DurableError,
    InvalidInput,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunNotFound,
    UpdateRejected,
    WaitTimeout,
    error_dict,
)

if TYPE_CHECKING:
    from .models import Run

# Run statuses, spelled here so importing durable does not import its models before Django is ready.
COMPLETED, FAILED, CANCELLED, DEAD = "completed", "failed", "cancelled", "dead"
TERMINAL = (COMPLETED, FAILED, CANCELLED, DEAD)

#: True while durable.testing captures messages: result() must not wait for work nobody runs.
never_wait = False


class RunHandle:
    """A reference to a run, returned by ``start``."""

    def __init__(self, run_id: str) -> None:
        self.id = run_id

    def status(self) -> str:
        return get_run(self.id).status

    def result(self, timeout: Any = None) -> Any:
        return result(self.id, timeout=timeout)

    def signal(self, name: str, payload: Any = None) -> None:
        signal(self.id, name, payload)

    def cancel(self, **kwargs: Any) -> bool:
        return cancel(self.id, **kwargs)

    def __repr__(self) -> str:
        return f"<RunHandle {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


def _runs() -> Any:
    from .models import Run

    return Run.objects.using(conf.get().DATABASE)


@functools.cache
def column_length(model: str, field: str) -> int:
    """The ``max_length`` of a durable model's column: what a string stored there may hold."""
    from django.apps import apps

    length: int = apps.get_model("durable", model)._meta.get_field(field).max_length
    return length


def _payload(value: Any, what: str) -> Any:
    return guards.json_value(value, what, max_bytes=conf.get().MAX_PAYLOAD_BYTES)


def _run_id(run_id: Any, *, reserved_ok: bool = True) -> str:
    """A run id to look up (any existing id) or, with ``reserved_ok=False``, one a caller picks."""
    return guards.run_id(run_id, max_length=column_length("Run", "id"), reserved_ok=reserved_ok)


def _name(value: Any, field: str, model: str) -> str:
    return guards.text(value, field, max_length=column_length(model, "name"), kind="name")


def _resolve(workflow: Workflow | str, version: str | None) -> Workflow:
    if isinstance(workflow, Workflow):
        return registry.workflow(workflow.name, version or workflow.version)
    if isinstance(workflow, str):
        return registry.workflow(workflow, version)
    raise InvalidInput(f"expected a @durable.workflow or a workflow name, got {workflow!r}")


def start(
    workflow: Workflow | str,
    input: Any = None,
    *,
    run_id: str | None = None,
    version: str | None = None,
    namespace: str | None = None,
    tags: Any = (),
    delay: Any = None,
) -> RunHandle:
    """Create a run (or return the existing one with this ``run_id``); its first turn is sent on commit."""
    if run_id is not None:
        _run_id(run_id, reserved_ok=False)
    return start_on_behalf(workflow, input, run_id=run_id, version=version, namespace=namespace, tags=tags, delay=delay)


def start_on_behalf(
    workflow: Workflow | str,
    input: Any = None,
    *,
    run_id: str | None = None,
    version: str | None = None,
    namespace: str | None = None,
    tags: Any = (),
    delay: Any = None,
) -> RunHandle:
    """``start()`` for the runs durable starts itself (dead letters, failure handlers, schedule
    ticks), whose ids carry the prefixes a caller may not use."""
    settings = conf.get()
    if isinstance(workflow, str):
        guards.text(workflow, "workflow", max_length=column_length("Run", "workflow"))
    definition = _resolve(workflow, version)
    if len(definition.name) > column_length("Run", "workflow"):
        raise guards.refuse("workflow", f"the name {guards.shown(definition.name)} is longer than "
                            f"{column_length('Run', 'workflow')} characters; give the workflow a shorter name=")
    run_id = _run_id(run_id) if run_id is not None else None
    stored_input = _payload(input, f"the input of workflow {definition.name!r}")
    if definition.input_schema is not None:
        try:
            definition.input_schema.model_validate(stored_input)
        except Exception as exc:  # noqa: BLE001 - whatever the schema library raises
            raise InvalidInput(f"the input does not fit workflow {definition.name!r}'s input_schema: {exc}") from exc
    if definition.validate_input is not None:
        try:
            definition.validate_input(stored_input)
        except Exception as exc:  # noqa: BLE001 - the validator's refusal, whatever its type
            raise InvalidInput(f"workflow {definition.name!r} refused its input: {exc}") from exc
    tags = guards.tags(tags, max_bytes=settings.MAX_PAYLOAD_BYTES)
    try:
        wait = timedelta(0) if delay is None else parse_duration(delay, what="delay")
    except ValueError as exc:
        raise guards.refuse("delay", str(exc).removeprefix("delay: ")) from None
    if namespace is not None:
        guards.text(namespace, "namespace", max_length=column_length("Run", "namespace"), allow_empty=True)

    if run_id is not None:
        existing = _runs().filter(id=run_id).first()
        if existing is not None:
            return _same_workflow(existing, definition.name)
    try:
        with transaction.atomic(using=settings.DATABASE):
            created = new_run(definition, stored_input, run_id=run_id, namespace=namespace, tags=tags, delay=wait)
    except IntegrityError:
        existing = _runs().filter(id=run_id).first()
        if existing is None:
            raise
        return _same_workflow(existing, definition.name)
    return RunHandle(created)


def new_run(
    definition: Workflow,
    stored_input: Any,
    *,
    run_id: str | None = None,
    namespace: str | None = None,
    tags: Any = (),
    delay: timedelta = timedelta(0),
    **links: Any,
) -> str:
    """Insert a validated run and send its first turn on commit; return its id."""
    from .engine import singletons

    settings = conf.get()
    now = clock.now()
    queue = definition.queue or settings.DEFAULT_QUEUE
    placed = singletons.place(definition, stored_input)
    # A pending run always carries a wake: its delay, or the safety net if the send is lost; a
    # singleton's run waiting in its key's line has only its delay (it is not claimable yet).
    wake_at = now + delay if delay else (None if placed else now + settings.RECONCILE_INTERVAL)
    run = _runs().create(
        id=run_id or uuid.uuid4().hex,
        workflow=definition.name,
        version=definition.version,
        queue=queue,
        input=stored_input,
        namespace=namespace if namespace is not None else (settings.NAMESPACE or ""),
        tags=sorted({*definition.tags, *tags}),
        created_at=now,
        updated_at=now,
        wake_at=wake_at,
        deadline=now + delay + definition.timeout if definition.timeout else None,
        **placed,
        **links,
    )
    if placed:
        singletons.admit(placed["singleton_key"], definition.name)
    elif not delay:
        dispatch.advance(run.id, queue)
    return run.id


def _same_workflow(existing: Run, name: str) -> RunHandle:
    if existing.workflow != name:
        raise InvalidInput(
            f"run id {existing.id!r} already belongs to workflow {existing.workflow!r}, not {name!r}; "
            "pick another run_id"
        )
    return RunHandle(existing.id)


def get_run(run_id: str) -> Run:
    """Return the run row, or raise RunNotFound."""
    run = _runs().filter(id=_run_id(run_id)).first()
    if run is None:
        raise RunNotFound(f"no run has id {run_id!r}")
    return run


def signal(run_id: str, name: str, payload: Any = None) -> None:
    """Deliver ``payload`` to the run's wait for ``name``, or keep it until the run waits."""
    _deliver(_run_id(run_id), name, _signal_payload(name, payload))


def signal_with_start(
    workflow: Workflow | str, input: Any = None, *, run_id: str, signal: str, payload: Any = None
) -> RunHandle:
    """Start run ``run_id`` unless it exists, then send it ``signal``, in one transaction: a
    concurrent start of the same id is the same run, and every signal sent this way is kept."""
    if run_id is None:
        raise InvalidInput("signal_with_start() needs the run_id of the run to start or signal")
    _run_id(run_id, reserved_ok=False)
    stored = _signal_payload(signal, payload)
    with transaction.atomic(using=conf.get().DATABASE):
        handle = start(workflow, input, run_id=run_id)
        _deliver(handle.id, signal, stored)
    return handle


def update(run_id: str, name: str, payload: Any = None) -> None:
    """Ask the run's workflow validator for ``name`` first (``@workflow.validator(name)``); if it
    accepts, deliver ``payload`` as signal ``name``. A refusal raises UpdateRejected, storing nothing."""
    stored = _signal_payload(name, payload)
    run = get_run(run_id)  # checks run_id
    if run.status in TERMINAL:
        raise RunFinished(f"run {run_id!r} has already finished ({run.status}); nothing was sent")
    validator = registry.workflow(run.workflow, run.version).validators.get(name)
    if validator is not None:
        try:
            validator(stored)
        except Exception as exc:  # noqa: BLE001 - the validator's refusal, whatever its type
            raise UpdateRejected(
                f"update {name!r} of run {run_id!r} was refused: {exc}", details=error_dict(exc)
            ) from exc
    _deliver(run_id, name, stored)


def publish_event(name: str, payload: Any = None) -> None:
    """Publish an event: every run waiting for ``name`` whose match the payload fits receives it,
    and it is kept for EVENT_BUFFER_TTL for waits that come later (each run gets it at most once)."""
    from .engine import events

    _name(name, "event name", "Event")
    payload = _payload(payload, f"the payload of event {name!r}")
    with transaction.atomic(using=conf.get().DATABASE):
        events.publish(name, payload)


def _signal_payload(name: Any, payload: Any) -> Any:
    _name(name, "signal name", "Signal")
    return _payload(payload, f"the payload of signal {name!r}")


def _deliver(run_id: str, name: str, payload: Any) -> None:
    settings = conf.get()
    with transaction.atomic(using=settings.DATABASE):
        run = get_run(run_id)
        now = clock.now()
        if not _runs().wake(run_id, now, now + settings.LEASE):
            raise RunFinished(f"run {run_id!r} has already finished ({get_run(run_id).status}); nothing was sent")
        run.signals.create(name=name, payload=payload, created_at=now)
        dispatch.advance(run_id, run.queue)


def cancel(run_id: str, *, compensate: bool = False, reason: str | None = None) -> bool:
    """Cancel an unfinished run; False if it had already finished."""
    settings = conf.get()
    _run_id(run_id)
    if not isinstance(compensate, bool):
        raise guards.refuse("compensate", f"must be True or False, got {guards.shown(compensate)}")
    guards.free_text(reason, "reason", max_bytes=settings.MAX_PAYLOAD_BYTES)
    error = {"message": reason or "cancelled", "type": "Cancelled", "code": "cancelled", "details": None}
    with transaction.atomic(using=settings.DATABASE):
        run = get_run(run_id)
        if compensate:
            # Durable intent: the next turn unwinds the saga, then marks the run cancelled.
            if not _runs().request_cancel(run_id, {"reason": reason}, clock.now()):
                return run.status not in TERMINAL
            dispatch.advance(run_id, run.queue)
            return True
        from .engine import lifecycle

        return lifecycle.cancel_tree(run_id, error)


def retry(run_id: str) -> RunHandle:
    """Run a failed, dead or cancelled run again from its history, the failures that ended it anew."""
    settings = conf.get()
    with transaction.atomic(using=settings.DATABASE):
        run = get_run(run_id)
        if run.status not in (FAILED, DEAD, CANCELLED):
            raise DurableError(f"only a failed, dead or cancelled run can be retried; run {run_id!r} is {run.status}")
        if run.checkpoints.filter(kind="compensation").exists():
            raise DurableError(f"run {run_id!r} was compensated; its effects were undone, so it cannot be retried")
        if run.failed_seqs:
            _fresh_attempt(run, run.failed_seqs)
        if not _runs().reopen(run_id, clock.now()):
            raise DurableError(f"run {run_id!r} changed while it was being retried; try again")
        if run.singleton_key:
            from .engine import singletons

            singletons.requeue(run)  # it waits for a slot again, at the back of its key's line
        else:
            dispatch.advance(run_id, run.queue)
    return RunHandle(run_id)


def _fresh_attempt(run: Run, seqs: list[int]) -> None:
    """Give the positions whose failure ended ``run`` a fresh attempt.

    A step or a wait is replayed as new; a child keeps its id, so the child run itself is
    retried and its end settles the position again.
    """
    from .models import Checkpoint

    children = run.checkpoints.filter(seq__in=seqs, kind="child")
    for child_input in children.values_list("input", flat=True):
        child_id = (child_input or {}).get("run_id")
        if child_id and get_run(child_id).status in (FAILED, DEAD, CANCELLED):
            retry(child_id)
    Checkpoint.objects.using(conf.get().DATABASE).reattempt(run.id, seqs)


def result(run_id: str, timeout: Any = None) -> Any:
    """Wait for the run to finish; return its output or raise RunFailed / RunCancelled / WaitTimeout."""
    _run_id(run_id)
    try:
        limit = None if timeout is None else parse_duration(timeout, what="timeout").total_seconds()
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    started = time.monotonic()
    pause = 0.005
    while True:
        run = get_run(run_id)
        if run.status == COMPLETED:
            successor = _runs().filter(continued_from_id=run.id).values_list("id", flat=True).first()
            if successor is not None:
                run_id = successor  # follow the continue-as-new chain to its last run
                continue
        if run.status in TERMINAL:
            return _outcome(run)
        if never_wait:
            raise WaitTimeout(
                f"run {run_id!r} is {run.status}, not finished; under durable_env call "
                "durable_env.run_until_idle() or advance_time() first",
                details={"status": run.status},
            )
        if limit is not None and time.monotonic() - started >= limit:
            raise WaitTimeout(f"run {run_id!r} is still {run.status} after {timeout}", details={"status": run.status})
        time.sleep(pause)
        # Short polls: a caller waits for a result by reading one indexed row.
        pause = min(pause * 1.5, 0.05)


def _outcome(run: Run) -> Any:
    if run.status == COMPLETED:
        return run.output
    error = run.error or {}
    if run.status == CANCELLED:
        raise RunCancelled(cause=error)
    raise RunFailed(cause=error, details=error.get("details"))


def delete_run(run_id: str) -> int:
    """Delete the run and its child subtree; return how many runs were deleted."""
    settings = conf.get()
    with transaction.atomic(using=settings.DATABASE):
        get_run(run_id)
        ids, frontier = [run_id], [run_id]
        while frontier:
            frontier = list(_runs().filter(parent_id__in=frontier).values_list("id", flat=True))
            ids.extend(frontier)
        # Unfinished singleton runs deleted here free their slots for the next in line.
        lines = set(_runs().filter(id__in=ids, status__in=("pending", "running", "suspended"))
                    .exclude(singleton_key=None).values_list("singleton_key", "workflow"))
        _runs().filter(id__in=ids).delete()
        if lines:
            from .engine import singletons

            for key, workflow in lines:
                singletons.admit(key, workflow)
    return len(ids)
