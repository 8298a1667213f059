"""Runs made and remade: started by a caller, a schedule tick or a failure handed over; started
by a parent's turn; continued as new; retried. And the signals that reach a run from outside.

Each call writes in the caller's transaction (a savepoint of its own where it must); the first
turn of a run it makes ready is sent on commit.
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction

from .. import clock, conf, dispatch, guards, ids, reads, routing, tracing
from ..definitions import Workflow, registry
from ..durations import parse_duration
from ..errors import DurableError, InvalidInput, RunFinished, RunNotFound
from ..limits import Lane, lane_option
from ..models import (
    RETRYABLE,
    UNFINISHED,
    Checkpoint,
    Run,
    RunQuerySet,
    Signal,
    Status,
    column_length,
)
from ..models.base import IDS_PER_STATEMENT, chunked
from ..replay.history import ChildStart
from ..replay.searchattributes import check_search_attributes
from ..values import json_value, stored
from . import singletons

log = logging.getLogger("durable.engine")

#: The largest priority a run may be given, either way.
MAX_PRIORITY = 1_000_000


def _runs() -> RunQuerySet:
    return Run.objects.using(conf.get().DATABASE)


def get_run(run_id: str) -> Run:
    """Return the run row, or raise RunNotFound."""
    run = _runs().filter(id=run_id).first()
    if run is None:
        raise RunNotFound(f"no run has id {run_id!r}")
    return run


def read_run(run_id: str) -> Run:
    """A caller's read of the run (``durable.get_run``): from the replica while one is read
    (``durable.reads``), else the primary; RunNotFound if neither holds it."""
    run = reads.read(lambda alias: Run.objects.using(alias).filter(id=run_id).first())
    if run is None:
        raise RunNotFound(f"no run has id {run_id!r}")
    return run


def resolve(workflow: Workflow | str, version: str | None) -> Workflow:
    """The registered definition of a ``@durable.workflow`` or a workflow name."""
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
    search_attributes: dict[str, Any] | None = None,
    lane: Any = None,
    priority: Any = 0,
) -> str:
    """Create a run (or return the existing one with this ``run_id``); return its id.

    Checks every argument, since durable's own starts (dead letters, failure handlers, schedule
    ticks) come this way too, under the id prefixes a caller may not use.
    """
    settings = conf.get()
    definition = startable(workflow, version)
    if run_id is not None:
        run_id = guards.run_id(run_id, max_length=column_length("Run", "id"), reserved_ok=True)
    stored_input = checked_input(definition, input, settings.MAX_PAYLOAD_BYTES)
    joined = joined_lane(definition, lane)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        raise guards.refuse(
            "priority", f"must be a whole number from -{MAX_PRIORITY} to {MAX_PRIORITY}, got {priority!r}"
        )
    tags = guards.tags(tags, max_bytes=settings.MAX_PAYLOAD_BYTES)
    try:
        wait = timedelta(0) if delay is None else parse_duration(delay, what="delay")
    except ValueError as exc:
        raise guards.refuse("delay", str(exc).removeprefix("delay: ")) from None
    if namespace is not None:
        guards.namespace(namespace, max_length=column_length("Run", "namespace"))
    attributes = first_search_attributes(definition, search_attributes, settings.MAX_PAYLOAD_BYTES)

    if run_id is not None:
        existing = _runs().filter(id=run_id).first()
        if existing is not None:
            return _same_workflow(existing, definition.name)

    def created() -> str:
        return create(
            definition,
            stored_input,
            run_id=run_id,
            namespace=namespace,
            tags=tags,
            delay=wait,
            search_attributes=attributes,
            lane=joined,
            priority=priority,
        )

    if run_id is None and definition.singleton is None and definition.lane is None and joined is None:
        # One INSERT that cannot conflict: it commits alone (or with the caller's transaction),
        # without a transaction or savepoint of its own around it.
        return created()
    try:
        with transaction.atomic(using=settings.DATABASE):
            return created()
    except IntegrityError:
        existing = _runs().filter(id=run_id).first()
        if existing is None:
            raise
        return _same_workflow(existing, definition.name)


def joined_lane(definition: Workflow, lane: Any) -> Lane | None:
    """The lane ``start(lane=...)`` puts a run of ``definition`` in (None: its own line, if any)."""
    joined = lane_option(lane, "start() lane=", member="runs")
    if joined is None or joined == definition.lane:
        return None
    if definition.lane is not None or definition.singleton is not None:
        raise guards.refuse(
            "lane",
            f"cannot move a run of {definition.name!r} into lane {joined.name!r}: its workflow has a line "
            "of its own (lane=, singleton= or concurrency=); start it without lane=",
        )
    return joined


def startable(workflow: Workflow | str, version: str | None) -> Workflow:
    """The definition a new run of ``workflow`` gets, its name checked to fit the row."""
    if isinstance(workflow, str):
        guards.text(workflow, "workflow", max_length=column_length("Run", "workflow"))
    definition = resolve(workflow, version)
    if len(definition.name) > column_length("Run", "workflow"):
        raise guards.refuse(
            "workflow",
            f"the name {guards.shown(definition.name)} is longer than "
            f"{column_length('Run', 'workflow')} characters; give the workflow a shorter name=",
        )
    return definition


def checked_input(definition: Workflow, input: Any, max_bytes: int) -> Any:
    """``input`` as a new run of ``definition`` stores it, refused with a clear error first."""
    what = f"the input of workflow {definition.name!r}"
    checked = stored(input, what=what, max_bytes=max_bytes)
    definition.check_input(checked)
    return checked


def first_search_attributes(definition: Workflow, mapping: Any, max_bytes: int) -> dict[str, Any]:
    """A new run's first search attributes, checked like an upsert (a None value is left out)."""
    if mapping is None:
        return {}
    checked = check_search_attributes(mapping, definition)
    json_value(checked, "search_attributes", max_bytes=max_bytes)
    return {name: value for name, value in checked.items() if value is not None}


def _same_workflow(existing: Run, name: str) -> str:
    if existing.workflow != name:
        raise InvalidInput(
            f"run id {existing.id!r} already belongs to workflow {existing.workflow!r}, not {name!r}; "
            "pick another run_id"
        )
    return existing.id


def create(
    definition: Workflow,
    stored_input: Any,
    *,
    run_id: str | None = None,
    namespace: str | None = None,
    tags: Any = (),
    delay: timedelta = timedelta(0),
    queue_limit: bool = True,
    lane: Lane | None = None,
    **links: Any,
) -> str:
    """Insert a validated run and send its first turn on commit; return its id. ``lane``: the
    lane it waits in when its workflow has none (``start(lane=...)``)."""
    settings = conf.get()
    now = clock.now()
    namespace = namespace if namespace is not None else (settings.NAMESPACE or "")
    queue = routing.queue_in(definition.queue or settings.DEFAULT_QUEUE, namespace)
    placed = singletons.place(definition, stored_input, queue_limit=queue_limit, lane=lane)
    # A pending run always carries a wake: its delay, or the safety net if the send is lost; a
    # singleton's run waiting in its key's line has only its delay (it is not claimable yet).
    wake_at = now + delay if delay else (None if placed else now + settings.RECONCILE_INTERVAL)
    run = _runs().add(
        id=run_id or ids.run_id(),
        workflow=definition.name,
        version=definition.version,
        queue=queue,
        input=stored_input,
        namespace=namespace,
        tags=sorted({*definition.tags, *tags}),
        created_at=now,
        updated_at=now,
        wake_at=wake_at,
        deadline=now + delay + definition.timeout if definition.timeout else None,
        **placed,
        **links,
    )
    attributes = {"durable.run_id": run.id, "durable.workflow": run.workflow, "durable.version": run.version}
    with tracing.span(f"durable.start {run.workflow}", run.id, attributes, link_caller=True):
        # Inside the span: the first turn's message carries its context.
        if placed:
            singletons.admit(placed["singleton_key"], definition.name)
        elif not delay:
            dispatch.first_turn(run.id, queue)
    return run.id


def start_children(parent: Run, children: list[ChildStart]) -> None:
    """Create the children a parent's turn starts, in that turn's transaction; an id that exists
    already (the turn ran before and lost its settle) is left as it is."""
    settings = conf.get()
    now = clock.now()
    for child in children:
        definition = registry.workflow(child.workflow, child.version)
        queue = routing.queue_in(definition.queue or settings.DEFAULT_QUEUE, parent.namespace)
        # A child of a singleton workflow waits in its key's line like any run (never refused:
        # the parent's history already holds it).
        placed = singletons.place(definition, child.input, queue_limit=False)
        # The parent's deadline is its children's too; a child's own timeout may come first.
        own = now + definition.timeout if definition.timeout else None
        deadline = min((d for d in (own, parent.deadline) if d is not None), default=None)
        created = _runs().start_child(
            child,
            parent=parent,
            now=now,
            queue=queue,
            reconcile=settings.RECONCILE_INTERVAL,
            deadline=deadline,
            on_parent_close=child.on_parent_close,
            **placed,
            **({"wake_at": None} if placed else {}),
        )
        if created and placed:
            singletons.admit(placed["singleton_key"], definition.name)
        elif created:
            dispatch.advance(child.run_id, queue)


def continue_as_new(
    run: Run, workflow: Workflow, input: Any, *, exposed: dict[str, Any] | None = None
) -> str:
    """Write the run that continues ``run`` (before ``run`` is marked completed); return its id.

    The successor starts with the values ``run`` exposed, so ``durable.query`` of the chain goes
    on answering with the latest of each until the successor exposes its own."""
    newest = registry.workflow(workflow.name)
    return create(
        newest,
        input,
        namespace=run.namespace or None,
        tags=run.tags,
        continued_from=run,
        parent_id=run.parent_id,
        parent_seq=run.parent_seq,
        exposed=run.exposed if exposed is None else exposed,
        priority=run.priority,
    )


def hand_over(run: Run, handler: Workflow | str | None, payload: dict[str, Any], run_id: str) -> None:
    """Start ``handler`` for ``run`` under a derived id, so a repeated hand-over starts nothing new."""
    if handler is None:
        return
    try:
        start(handler, payload, run_id=run_id, namespace=run.namespace or None)
    except DurableError as exc:
        log.warning("durable: could not hand run %s over to %r: %s", run.id, handler, exc)


def signal_with_start(workflow: Workflow | str, input: Any, *, run_id: str, signal: str, payload: Any) -> str:
    """Start run ``run_id`` unless it exists, then deliver ``signal``, in one transaction."""
    with transaction.atomic(using=conf.get().DATABASE):
        started = start(workflow, input, run_id=run_id)
        deliver(started, signal, payload)
    return started


def deliver(
    run_id: str, name: str, payload: Any, *, idempotency_key: str | None = None, update: bool = False
) -> int:
    """Keep ``payload`` as signal ``name`` (an update, with ``update``) for the run's wait, and
    wake the run; return the signal's id.

    A signal whose ``idempotency_key`` this run already has is dropped, finished run or not, and
    the id of the one kept is returned: the unique constraint on (run, key) decides between
    concurrent senders, the lookup first only spares the common repeat a failed INSERT.
    """
    settings = conf.get()
    signals = Signal.objects.using(settings.DATABASE)
    if idempotency_key is not None:
        kept = signals.keyed(run_id, idempotency_key)
        if kept is not None:
            return kept.id
    try:
        with transaction.atomic(using=settings.DATABASE):
            run = get_run(run_id)
            now = clock.now()
            if not _runs().wake(run_id, now, now + settings.LEASE):
                carried = (
                    None if idempotency_key is None else signals.keyed(run_id, idempotency_key, finished=True)
                )
                if carried is not None:
                    return carried.id  # sent before the run continued as new, and carried on
                raise RunFinished(
                    f"run {run_id!r} has already finished ({get_run(run_id).status}); nothing was sent"
                )
            signal = signals.create(
                run=run,
                name=name,
                payload=payload,
                created_at=now,
                is_update=update,
                idempotency_key=idempotency_key,
            )
            dispatch.advance(run_id, run.queue)
            return signal.id
    except IntegrityError:
        kept = None if idempotency_key is None else signals.keyed(run_id, idempotency_key)
        if kept is None:
            raise
        return kept.id


def retry(run_id: str) -> None:
    """Run a failed, dead or cancelled run again from its history, the failures that ended it anew."""
    settings = conf.get()
    with transaction.atomic(using=settings.DATABASE):
        run = get_run(run_id)
        if run.status not in RETRYABLE:
            raise DurableError(
                f"only a failed, dead or cancelled run can be retried; run {run_id!r} is {run.status}"
            )
        if run.checkpoints.filter(kind="compensation").exists():
            raise DurableError(
                f"run {run_id!r} was compensated; its effects were undone, so it cannot be retried"
            )
        if run.failed_seqs:
            _fresh_attempt(run, run.failed_seqs)
        if not _runs().reopen(run_id, clock.now()):
            raise DurableError(f"run {run_id!r} changed while it was being retried; try again")
        if run.singleton_key:
            singletons.requeue(run)  # it waits for a slot again, at the back of its key's line
        else:
            dispatch.advance(run_id, run.queue)


def _fresh_attempt(run: Run, seqs: list[int]) -> None:
    """Give the positions whose failure ended ``run`` a fresh attempt.

    A step or a wait is replayed as new; a child keeps its id, so the child run itself is
    retried and its end settles the position again.
    """
    for batch in chunked(seqs, IDS_PER_STATEMENT):  # every member of a wide fan may have failed
        children = run.checkpoints.filter(seq__in=batch, kind="child")
        for child_input in children.values_list("input", flat=True):
            child_id = (child_input or {}).get("run_id")
            if child_id and get_run(child_id).status in RETRYABLE:
                retry(child_id)
    Checkpoint.objects.using(conf.get().DATABASE).reattempt(run.id, seqs)


def ending(run_id: str) -> Run:
    """What a caller waiting for ``run_id`` reads each time it looks: the run's status, output and
    error by one plain statement (it may look thousands of times), or, for a run that continued
    as new, the newest run of its chain (as ``follow``)."""
    run = reads.read(lambda alias: Run.objects.using(alias).ending(run_id))
    if run is None:
        raise RunNotFound(f"no run has id {run_id!r}")
    if run.status == Status.COMPLETED and isinstance(run.output, dict) and "continued_as" in run.output:
        return follow(run_id)  # its output names its successor (or is a body's own such dict)
    return run


def follow(run_id: str) -> Run:
    """The run, or the newest run of the continue-as-new chain it completed into (a caller's
    read: see ``read_run``)."""
    run = read_run(run_id)
    while run.status == Status.COMPLETED:
        successor = reads.read(functools.partial(_successor, run_id=run.id))
        if successor is None:
            break
        run = read_run(successor)
    return run


def _successor(alias: str, run_id: str) -> str | None:
    found: str | None = (
        Run.objects.using(alias).filter(continued_from_id=run_id).values_list("id", flat=True).first()
    )
    return found


def delete(run_id: str) -> int:
    """Delete the run and its child subtree; return how many runs were deleted."""
    with transaction.atomic(using=conf.get().DATABASE):
        get_run(run_id)
        ids, frontier = [run_id], [run_id]
        # Unfinished singleton runs deleted here free their slots for the next in line.
        lines: set[tuple[str, str]] = set()
        while frontier:
            level = _runs().children_of(frontier, "id", "status", "singleton_key", "workflow")
            frontier = [child_id for child_id, *_ in level]
            ids.extend(frontier)
            lines |= {(key, name) for _, status, key, name in level if key and status in UNFINISHED}
        root = _runs().filter(id=run_id, status__in=UNFINISHED).exclude(singleton_key=None)
        lines |= set(root.values_list("singleton_key", "workflow"))
        _runs().delete_in_order(ids[::-1])
        for key, workflow in lines:
            singletons.admit(key, workflow)
    return len(ids)
