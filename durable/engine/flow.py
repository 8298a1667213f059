"""Fleet-wide step limits: ``concurrency`` slots and ``rate_limit`` tokens, taken when a worker
starts an attempt and handed on when it ends.

A worker starts a limited attempt only once its key's gate (locked) shows a free slot and a
rate token; otherwise the attempt waits durably, sent but unstarted: in line for a slot (the
attempt that frees one sends the oldest waiter in its own transaction) or until its rate token
is due (its run's timer sends it again). The timer sweep admits whatever a lost hand-off left.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import connections, transaction

from .. import clock, conf, dispatch
from ..definitions import Step, registry
from ..errors import InvalidInput
from ..limits import Rate
from ..models import (
    HELD,
    RATE,
    UNFINISHED,
    WAITING,
    Checkpoint,
    FlowGate,
    FlowStart,
    Run,
    in_flight,
    in_line,
)
from ..models import flow as lines
from ..replay.history import PENDING, Record
from ..replay.turnstate import TurnState
from ..statuses import CheckpointStatus

log = logging.getLogger("durable.engine")

#: Keys with waiting attempts one repair pass looks at.
REPAIR_BATCH = 100
#: A rate token is stamped a few milliseconds before the step's body starts, and that lag
#: varies: each start counts this much longer than its period, so the bodies' own starts
#: keep to the limit too.
RATE_SLACK = timedelta(milliseconds=100)


@dataclass(frozen=True)
class Waits:
    """The attempt did not start: it waits for a slot (``until`` None) or a rate token."""

    key: str
    until: datetime | None = None


@dataclass(frozen=True)
class Refused:
    """The attempt cannot say which slot it needs (its key could not be made): it fails."""

    error: dict[str, Any]


def any_limited() -> bool:
    """Whether a registered step has a fleet-wide limit (else nothing here costs a query)."""
    return any(step.limited for step in registry.steps.values())


def slot_key(step: Step, payload: Any) -> str:
    """The gate key of the slot an attempt with ``payload`` needs (InvalidInput if none): the
    step's own, or its lane's, which every step of the lane shares."""
    assert step.concurrency is not None
    key = step.concurrency.key_for(step.fn, *_arguments(payload))
    return _fit(f"c:{_owner(step)}:{key}")


def rate_key(step: Step, payload: Any) -> str:
    """The gate key of the rate an attempt with ``payload`` counts in: the step's, or its lane's
    (per the lane's key, when it has one)."""
    if step.lane is None or step.lane.per_key is None:
        return _fit(f"r:{_owner(step)}")
    return _fit(f"r:{_owner(step)}:{step.lane.key_for(step.fn, *_arguments(payload))}")


def _owner(step: Step) -> str:
    return step.name if step.lane is None else f"lane:{step.lane.name}"


def _arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    args = payload or {}
    return list(args.get("args", [])), dict(args.get("kwargs", {}))


def _fit(key: str) -> str:
    # A gate key is a primary key: a long one is shortened, still unique, still readable.
    return key if len(key) <= 255 else f"{key[:200]}#{hashlib.sha256(key.encode()).hexdigest()}"


class _Attempt(Protocol):
    """An attempt about to start: a Checkpoint row a worker took, or a turn's Record."""

    seq: int
    attempt: int
    input: Any
    flow: str | None
    flow_key: str | None


def admit_start(
    run_id: str,
    row: _Attempt,
    step: Step,
    now: datetime,
    *,
    sent_at: datetime | None = None,
    idle: set[str] | None = None,
) -> Waits | Refused | None:
    """Called in the transaction that started ``row``: None if it may run now (``row.flow``
    and ``row.flow_key`` then say which slot it holds), else why not (its start is then undone,
    and it waits). ``sent_at``: a turn started it in place, unsent; it waits as sent then.
    ``idle`` gains the key of a gate this locked (until the commit) with nobody in its line."""
    settings = conf.get()
    db = settings.DATABASE
    args = (db, run_id, row.seq, row.attempt)
    sent: dict[str, Any] = {} if sent_at is None else {"enqueued_at": sent_at}
    if step.concurrency is not None and row.flow != HELD:
        try:
            key = slot_key(step, row.input)
        except InvalidInput as exc:
            return Refused(exc.to_dict())
        gates = FlowGate.objects.using(db)
        gate = gates.lock(key)
        assert gate is not None
        # Behind the attempts already in line, if any (the gate's count is an upper bound).
        if not lines.hold_slot(*args, key, step.concurrency.limit, now, behind=gate.waiting > 0):
            if sent_at is not None:
                sent["wake_at"] = sent_at + settings.STEP_REDISPATCH_AFTER
            lines.wait_in_line(*args, key, gates.join_line(gate), **sent)
            return Waits(key)
        row.flow, row.flow_key = HELD, key
        if idle is not None and gate.waiting <= 0:
            idle.add(key)
    if step.rate_limit is not None:
        try:
            counted_in = rate_key(step, row.input)
        except InvalidInput as exc:
            return Refused(exc.to_dict())
        until = _rate_token(step.rate_limit, counted_in)
        if until is not None:
            freed = row.flow_key if row.flow == HELD else None
            lines.wait_for_rate(*args, counted_in, until, **sent)
            if freed:
                hand_off(freed)  # it waits for its token without the slot it had
            # The caller brings the run's timer forward once this commits: no run row is
            # locked while a gate is (a recorded result locks them the other way round).
            return Waits(counted_in, until)
    return None


def started_in_place(records: Iterable[Record]) -> list[tuple[Record, Step]]:
    """The attempts of limited steps a turn just started in place (written as started, never
    sent) that hold no slot yet: ``admit_in_place`` gives them theirs."""
    found = []
    for rec in records:
        if (
            rec.kind == "step"
            and rec.status == PENDING
            and rec.started_at is not None
            and rec.enqueued_at is None
            and rec.held_by is None
            and rec.flow is None
        ):
            step = registry.steps.get(rec.name)
            if step is not None and step.limited:
                found.append((rec, step))
    return found


def slot_kept(started: list[tuple[Record, Step]], freed: list[str]) -> str | None:
    """The key of the one slot a turn's result run in place freed, when the one limited attempt
    it starts next needs a slot of that key and nothing more (no rate token): written together,
    the attempt may keep the slot (``models.flow.keeping_slot``). Else None."""
    if len(started) != 1 or len(freed) != 1:
        return None
    rec, step = started[0]
    if step.concurrency is None or step.rate_limit is not None:
        return None
    try:
        key = slot_key(step, rec.input)
    except InvalidInput:
        return None
    return key if key == freed[0] else None


def admit_in_place(run_id: str, started: list[tuple[Record, Step]], state: TurnState) -> None:
    """Called in the transaction of the turn's write that started them, after its rows: give
    each attempt its slot and rate token, as a worker's take would, or make it one sent but
    unstarted that waits in line or for its token (its record changed to match: the body's
    primitive then finds it waiting). An attempt whose limit key cannot be made is sent, and
    the worker that takes it fails it with the reason."""
    settings = conf.get()
    now = clock.now()
    redispatch_at = now + settings.STEP_REDISPATCH_AFTER
    idle: set[str] = set()
    for rec, step in started:
        held_back = admit_start(run_id, rec, step, now, sent_at=now, idle=idle)
        if held_back is None:
            continue
        rec.started_at, rec.enqueued_at = None, now
        if isinstance(held_back, Refused):
            lines.send_unstarted(settings.DATABASE, run_id, rec.seq, rec.attempt, now, redispatch_at)
            rec.wake_at = redispatch_at
            state.dispatch.append(rec)
        elif held_back.until is None:
            rec.flow, rec.flow_key, rec.wake_at = WAITING, held_back.key, redispatch_at
        else:
            rec.flow, rec.flow_key, rec.wake_at = RATE, held_back.key, held_back.until
    # A slot this write frees (the result before, written with it) has nobody to go to in a line
    # found empty with its gate locked to the commit: no waiter can join it before then.
    state.freed[:] = [key for key in state.freed if key not in idle]


def wake_for_token(run_id: str, until: datetime) -> None:
    """Have the run send its attempt again when its rate token falls due: its timer (the
    truth) and, for a near token, a countdown that beats the timer sweep's next pass."""
    settings = conf.get()
    queue = Run.objects.using(settings.DATABASE).wake_by(run_id, until)
    if queue is None:
        return
    with transaction.atomic(using=settings.DATABASE):  # sent on commit, as every message is
        dispatch.advance_at(run_id, queue or settings.DEFAULT_QUEUE, until)


def _rate_token(rate: Rate, key: str) -> datetime | None:
    """Take a rate token now (None), or say when the next one falls due.

    A sliding window of the real starts: never more than ``count`` in any ``period``. The
    attempts already waiting are spread over the tokens ahead of them, so they do not all
    come back at once."""
    db = conf.get().DATABASE
    FlowGate.objects.using(db).lock(key)
    # Read once the gate is ours: a start is stamped when it happens, not when it asked.
    now = clock.now()
    starts = FlowStart.objects.using(db)
    period = rate.period + RATE_SLACK
    since = now - period
    window = starts.within(key, since)
    if len(window) < rate.count:
        starts.create(key=key, at=now)
        starts.forget(key, since)
        return None
    ahead = Checkpoint.objects.using(db).filter(flow_key=key, flow=RATE, wake_at__gt=now).count()
    rounds, place = divmod(ahead, rate.count)
    return window[len(window) - rate.count + place] + period * (rounds + 1)


def hand_off(key: str) -> list[int]:
    """Give ``key``'s free slots to its oldest waiting attempts and send each (on commit).

    Call in the transaction that freed a slot, after any run row it locks (gates come last), or
    right after its commit (a process that dies between leaves the waiters to ``repair``)."""
    settings = conf.get()
    db = settings.DATABASE
    gates = FlowGate.objects.using(db)
    connection = connections[db]
    if not connection.in_atomic_block and connection.features.has_select_for_update:
        # After the commit: a locking read on its own waits for a start that counted the slot
        # as still held to commit its place in line, so it misses no waiter; one statement and
        # no transaction when nobody waits.
        gate = gates.lock(key, create=False)
        if gate is None or gate.waiting <= 0:
            return []
    with transaction.atomic(using=db, savepoint=False):  # the caller's, when it has one
        gate = gates.lock(key, create=False)
        if gate is None or gate.waiting <= 0:
            return []  # one statement when nobody waits: a limit never reached costs little
        line = in_line(db, key)
        waiting = line.count()
        gates.note_waiting(gate, waiting)
        first = line.values_list("name", flat=True).first() if waiting else None
        step = registry.steps.get(first) if first is not None else None
        if step is None:
            return []  # nobody waits, or this process lacks the step's code: one that has it will
        limit = step.concurrency.limit if step.concurrency is not None else 1_000_000_000
        now = clock.now()
        free = limit - in_flight(db, key, now).count()
        if free <= 0:
            return []
        admitted = []
        for row in line.only("id", "run_id", "seq", "attempt", "token", "queue")[:free]:
            if lines.admit(db, row.pk, now, now + settings.STEP_REDISPATCH_AFTER):
                dispatch.run_step(
                    row.run_id,
                    row.seq,
                    row.attempt,
                    row.token,
                    row.queue or settings.DEFAULT_QUEUE,
                )
                admitted.append(row.pk)
        gates.note_waiting(gate, waiting - len(admitted))
        return admitted


def may_hold_slots(records: Iterable[Record]) -> bool:
    """Whether any of a run's positions is a pending attempt of a limited step (asked in
    memory, so a run without one ends without a query)."""
    for rec in records:
        if rec.kind == "step" and rec.status == PENDING:
            step = registry.steps.get(rec.name)
            if step is not None and step.limited:
                return True
    return False


def freed_by_run(run_id: str) -> None:
    """A run ended (cancelled, failed, timed out...): hand on the slots its attempts held."""
    if not any_limited():
        return
    db = conf.get().DATABASE
    keys = (
        Checkpoint.objects.using(db)
        .filter(run_id=run_id, flow=HELD, status=CheckpointStatus.PENDING)
        .order_by()
        .values_list("flow_key", flat=True)
        .distinct()
    )
    for key in sorted(set(keys)):
        hand_off(key)


def repair() -> int:
    """Admit waiting attempts whose key has free slots (a hand-off lost with its process, a
    holder that died, a limit raised by a deploy). One read when nothing waits."""
    if not any_limited():
        return 0
    db = conf.get().DATABASE
    unfinished = Run.objects.using(db).filter(status__in=UNFINISHED).values("id")
    keys = (
        Checkpoint.objects.using(db)
        .filter(
            flow=WAITING, status=CheckpointStatus.PENDING, run_id__in=unfinished
        )  # a cancelled run's waiters wait for no one
        .order_by()
        .values_list("flow_key", flat=True)
        .distinct()[:REPAIR_BATCH]
    )
    return sum(len(hand_off(key)) for key in sorted(set(keys)))
