"""Durable entities: store ops, apply them one key at a time, and the sweep that repairs lost prompts.

Applying is one transaction per batch: lock the entity row, run each pending op of the key in
arrival order on the current state, mark it applied (or failed, the state as it was) and write the
new state, then answer and wake the workflows waiting in ``ctx.call_entity``. The op row is the
truth; the ``durable.apply_entity`` message only a prompt, sent again by ``sweep_entities``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from django.db import connections, transaction
from django.db.models import Q

from .. import clock, conf, dispatch, guards, routing
from ..entity_classes import Entity as Definition
from ..entity_classes import registry, version_key
from ..errors import InvalidInput, error_dict
from ..models import Checkpoint, Entity, EntityOp, EntityPrompt, OpStatus, Run
from ..models.entities import Prompt
from ..replay.history import Record
from ..statuses import CheckpointStatus
from . import lifecycle

log = logging.getLogger("durable.engine")

#: Ops applied per transaction: a long backlog on one key commits as it goes.
BATCH = 100
#: Batches one prompt or one sweep pass takes at most.
MAX_BATCHES = 20


def queue_of(name: str) -> str:
    """The queue the ops of entity ``name`` are applied on."""
    settings = conf.get()
    versions = registry.entities.get(name)
    if not versions:
        return settings.DEFAULT_QUEUE
    return registry.get(name).queue or settings.DEFAULT_QUEUE


def send(
    name: str,
    key: str,
    op: str,
    arg: Any,
    op_id: str,
    *,
    caller: tuple[str, int] | None = None,
    namespace: str | None = None,
) -> None:
    """Store an op in the caller's transaction; its key is prompted after the commit, unless the
    statement found the key's prompt on its way (outside a transaction). The same ``op_id`` again
    for this key is dropped. ``namespace``: the sender's (``DURABLE["NAMESPACE"]``
    when None)."""
    settings = conf.get()
    namespace = namespace if namespace is not None else (settings.NAMESPACE or "")
    now = clock.now()
    row = EntityOp(entity=name, key=key, op=op, op_id=op_id, arg=arg, namespace=namespace, created_at=now)
    if caller is not None:
        row.caller_run_id, row.caller_seq = caller
    sent = EntityOp.objects.using(settings.DATABASE).send(row, now)
    if sent is not Prompt.FOUND:
        prompt(name, key, namespace, claimed=sent is Prompt.CLAIMED)


def prompt(name: str, key: str, namespace: str, *, claimed: bool = False) -> None:
    """After the commit, prompt the key's applier, unless a prompt sent earlier and not yet taken
    will see this commit's ops (``EntityPrompt``): a busy key gets a message per busy spell.
    ``claimed``: the op's own statement noted the prompt; its message leaves without a claim."""
    prompts = EntityPrompt.objects.using(conf.get().DATABASE)
    dispatch.apply_entity(
        name,
        key,
        routing.queue_in(queue_of(name), namespace),
        claim=(lambda: True) if claimed else (lambda: prompts.claim(name, key, clock.now())),
        unclaim=lambda: prompts.take(name, key),
    )


def send_from_run(run_id: str, records: list[Record]) -> None:
    """Store the ops of a turn's new ``entity`` positions, in the turn's transaction (call before
    the positions are written: an op id it changes is stored with them). Their ids derive from the
    run and position, and a recorded position is never sent again, so replays send nothing twice."""
    if not records:
        return
    runs = Run.objects.using(conf.get().DATABASE).filter(id=run_id)
    namespace = next(iter(runs.values_list("namespace", flat=True)), "") or ""
    for rec in records:
        spec = rec.input
        taken = _attempts_sent(spec["entity"], spec["key"], spec["op_id"])
        if taken:
            # The position was forgotten by retry(): the op gets a fresh attempt, under a new id.
            spec["op_id"] = f"{spec['op_id']}#{taken}"
        caller = (run_id, rec.seq) if spec.get("call") else None
        send(
            spec["entity"],
            spec["key"],
            spec["op"],
            spec["arg"],
            spec["op_id"],
            caller=caller,
            namespace=namespace,
        )


def _attempts_sent(name: str, key: str, op_id: str) -> int:
    """The number of the position's next op attempt: 0 if no op with this id is kept, else one
    past the highest (``<op id>#<n>``) kept."""
    ops = EntityOp.objects.using(conf.get().DATABASE).filter(entity=name, key=key)
    sent = ops.filter(Q(op_id=op_id) | Q(op_id__startswith=f"{op_id}#")).values_list("op_id", flat=True)
    suffixes = [sent_id[len(op_id) + 1 :] for sent_id in sent]
    numbers = [int(n) if n.isdigit() else 0 for n in suffixes]
    return max(numbers) + 1 if numbers else 0


def apply(name: str, key: str) -> int:
    """Apply the pending ops of (``name``, ``key``); return how many were applied."""
    settings = conf.get()
    try:
        definition = registry.get(name)
    except InvalidInput:
        # A rolling deploy: this worker lacks the code. The sweep prompts again later.
        log.warning("durable: entity %r is not registered here; its ops are left for another worker", name)
        return 0
    if settings.NAMESPACE and not _ours(name, key, settings):
        return 0
    ops = EntityOp.objects.using(settings.DATABASE)
    prompts = EntityPrompt.objects.using(settings.DATABASE)
    total = 0
    for _ in range(MAX_BATCHES):
        if not ops.waiting(name, key):
            # The prompt is taken only once nothing waits: until then the senders of the key's
            # new ops find it and send no message, and this loop applies their ops. An op
            # committed before the take is seen by the read after it; one committed after it
            # sends a prompt of its own.
            prompts.take(name, key)
            if not ops.waiting(name, key):
                return total
        with transaction.atomic(using=settings.DATABASE):
            done = _apply_batch(definition, key, settings, careful=False)
        if done is None:  # rolled back: an op that used the database raised
            with transaction.atomic(using=settings.DATABASE):
                done = _apply_batch(definition, key, settings, careful=True)
        assert done is not None
        total += done
        if not done:
            # What waits is not this worker's to apply (newer code wrote the state, or the next
            # op is another namespace's), or another applier took it: an applier that applies,
            # or the sweep, takes it from here.
            prompts.take(name, key)
            return total
    # The rest in a message of its own, to the queue of the namespace this one came in.
    prompts.take(name, key)
    namespace = next(iter(ops_namespaces(name, key)), settings.NAMESPACE or "")
    prompt(name, key, namespace)
    return total


def _ours(name: str, key: str, settings: conf.Settings) -> bool:
    """Whether the key's oldest pending op was sent in this worker's namespace; if not, its prompt
    was misrouted (or forged): it is left, untaken, to the workers of the op's namespace."""
    theirs = ops_namespaces(name, key)
    if not theirs or routing.serves(settings.NAMESPACE, theirs[0]):
        return True
    log.warning(
        "durable: refused to apply the ops of entity %s:%s: they were sent in namespace %r and "
        "this worker serves %r only (a misrouted or forged message); nothing changed",
        name,
        key,
        theirs[0],
        settings.NAMESPACE,
    )
    return False


def _served(batch: list[EntityOp], settings: conf.Settings) -> list[EntityOp]:
    """The ops of ``batch`` before the first one sent in a namespace this worker does not serve:
    that one and those after it wait, in order, for its namespace's workers."""
    for position, op in enumerate(batch):
        if not routing.serves(settings.NAMESPACE, op.namespace):
            return batch[:position]
    return batch


def _apply_batch(definition: Definition, key: str, settings: conf.Settings, *, careful: bool) -> int | None:
    """Apply a batch of the key's pending ops; return how many. None when the batch was rolled
    back to run again ``careful`` (see ``_run``)."""
    db, now = settings.DATABASE, clock.now()
    ops = EntityOp.objects.using(db)
    obj = definition.instance(key)
    try:
        row = Entity.objects.using(db).lock(
            definition.name, key, lambda: _initial(definition, obj, settings), definition.version, now
        )
    except InvalidInput as exc:
        # No state to start from: the key's ops fail with the reason, and none is applied.
        batch = _served(ops.next_pending(definition.name, key, BATCH), settings)
        for op in batch:
            op.result, op.error = None, exc.to_dict()
        _settle(definition, key, batch, now, settings)
        return len(batch)
    if version_key(row.version) > version_key(definition.version):
        log.warning(
            "durable: entity %s:%s was written by version %s; this worker has %s and leaves it alone",
            definition.name,
            key,
            row.version,
            definition.version,
        )
        return 0
    batch = _served(ops.next_pending(definition.name, key, BATCH), settings)
    if not batch:
        return 0
    state = row.state
    for op in batch:
        outcome = _run(definition, obj, op, state, settings, careful=careful)
        if outcome is None:
            transaction.set_rollback(True, using=db)
            return None
        op.result, op.error, state = outcome
    _settle(definition, key, batch, now, settings)
    Entity.objects.using(db).write(row, state, definition.version, len(batch), batch[-1].id, now)
    keep = settings.ENTITY_OPS_KEPT
    if (row.applied + len(batch)) // keep > row.applied // keep:
        # Once per ENTITY_OPS_KEPT ops: the key's history stays bounded at a cost per op that
        # does not grow with it.
        ops.prune(definition.name, key, keep)
    return len(batch)


def _settle(
    definition: Definition, key: str, batch: list[EntityOp], now: Any, settings: conf.Settings
) -> None:
    """Record how each op of ``batch`` ended, and answer the workflows that called them."""
    if not EntityOp.objects.using(settings.DATABASE).settle(batch, now):
        # Another applier settled one of them: roll this batch back, never count an op twice.
        raise RuntimeError(f"ops of entity {definition.name}:{key} were settled by another applier")
    for op in batch:
        if op.caller_run_id is not None and op.caller_seq is not None:
            _answer(op.caller_run_id, op.caller_seq, op.result, op.error, settings)


def _initial(definition: Definition, obj: Any, settings: conf.Settings) -> Any:
    try:
        state = obj.initial_state()
    except Exception as exc:  # noqa: BLE001 - reported on the ops of the key until fixed
        raise InvalidInput(f"initial_state() of entity {definition.name!r} raised {exc!r}") from None
    return guards.plain_json(
        state, f"the initial state of entity {definition.name!r}", max_bytes=settings.MAX_PAYLOAD_BYTES
    )


def _run(
    definition: Definition, obj: Any, op: EntityOp, state: Any, settings: conf.Settings, *, careful: bool
) -> tuple[Any, dict[str, Any] | None, Any] | None:
    """Run one op on a copy of ``state``: (result, None, new state), or (None, error, ``state``)
    when it raised or left something that is not JSON.

    What a raising op wrote to the database must go with it: ``careful``, each op runs in a
    savepoint; otherwise (the fast path: most ops touch only their state) None says that one
    which used the database raised, and the batch must be rolled back and run carefully.
    """
    what = f"entity {definition.name!r} op {op.op!r}"
    working = copy.deepcopy(state)
    connection = connections[settings.DATABASE]
    callbacks, used = len(connection.run_on_commit), []

    def noted(execute: Any, *args: Any) -> Any:
        used.append(True)
        return execute(*args)

    try:
        with transaction.atomic(using=settings.DATABASE) if careful else connection.execute_wrapper(noted):
            method = definition.method(obj, op.op)
            result = guards.plain_json(
                method(working, op.arg), f"the result of {what}", max_bytes=settings.MAX_PAYLOAD_BYTES
            )
            working = guards.plain_json(
                working, f"the state left by {what}", max_bytes=settings.MAX_PAYLOAD_BYTES
            )
    except Exception as exc:  # noqa: BLE001 - the op's failure is its outcome, recorded on its row
        if not careful and (used or len(connection.run_on_commit) != callbacks):
            return None
        return None, error_dict(exc), state
    return result, None, working


def _answer(
    run_id: str, seq: int, result: Any, error: dict[str, Any] | None, settings: conf.Settings
) -> None:
    """Settle the ``ctx.call_entity`` position waiting for this op, and wake its run."""
    status = CheckpointStatus.FAILED if error is not None else CheckpointStatus.COMPLETED
    if Checkpoint.objects.using(settings.DATABASE).settle_entity_call(
        run_id, seq, status, result, error, clock.now()
    ):
        lifecycle.wake(run_id)


def state(name: str, key: str) -> Any:
    """The state of (``name``, ``key``) after its last applied op (the initial state if none)."""
    definition = registry.get(name)
    row = Entity.objects.using(conf.get().DATABASE).filter(name=name, key=key).values_list("state", flat=True)
    for stored in row:
        return stored
    return _initial(definition, definition.instance(key), conf.get())


def ops_namespaces(name: str, key: str) -> list[str]:
    """The namespaces of the key's pending ops, oldest op first (one read, at most one row)."""
    ops = EntityOp.objects.using(conf.get().DATABASE).filter(entity=name, key=key, status=OpStatus.PENDING)
    return list(ops.order_by("id").values_list("namespace", flat=True)[:1])


def sweep_entities() -> int:
    """Prompt again every key with an op pending for longer than ENTITY_SWEEP_INTERVAL (its
    message was lost, or its worker died); return how many keys were prompted. A process with a
    ``NAMESPACE`` sweeps the ops sent in it only."""
    settings = conf.get()
    before = clock.now() - settings.ENTITY_SWEEP_INTERVAL
    # A prompt this old and never taken was lost: the key's next op sends one again.
    EntityPrompt.objects.using(settings.DATABASE).expire(before)
    prompted: set[tuple[str, str]] = set()
    after = 0
    for _ in range(MAX_BATCHES):
        ops = EntityOp.objects.using(settings.DATABASE).serving(settings.NAMESPACE)
        rows = ops.stranded(before, after, settings.TIMER_BATCH_SIZE)
        for _id, name, key, namespace in rows:
            if (name, key) not in prompted:
                prompted.add((name, key))
                dispatch.apply_entity(name, key, routing.queue_in(queue_of(name), namespace))
        if len(rows) < settings.TIMER_BATCH_SIZE:
            break
        after = rows[-1][0]
    return len(prompted)
