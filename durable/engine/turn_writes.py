"""What a turn writes: the positions it added or changed, with what goes with them (failed
attempts, replies, signals taken, messages), fenced by its lease or by its final settle."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from django.db import connections, transaction

from .. import clock, conf, dispatch, routing
from ..definitions import registry
from ..errors import _ControlFlow
from ..models import HELD, AttemptError, Checkpoint, Fan, Run, Signal
from ..models import flow as lines
from ..models.result_and_turn import Held
from ..replay.history import COMPLETED, PENDING, Record
from ..replay.turnstate import TurnState
from . import asyncattempts, entity_ops, flow, observe, streams, turn_messages


class LeaseLost(_ControlFlow):
    """This turn's lease was taken over: it must write nothing more."""


class _Stale(_ControlFlow):
    """A guarded write matched no row: something changed since the turn read the run.

    Control flow, so a flush that meets it mid-body cannot be swallowed by the body."""


def keep_held_results(run_id: str, owner: str, state: TurnState, db: str) -> None:
    """A wake refused the settle, and the turn replays from what is stored: the results of
    attempts run in place that waited for the settle are facts whatever the replay decides, so
    they are written alone, under the lease (else the replay would count them lost)."""
    held = [rec for rec in state.unsaved() if _held(rec)]
    if not held:
        return
    with transaction.atomic(using=db):
        for rec in held:
            fields = {f: getattr(rec, f) for f in _WRITTEN}
            Checkpoint.objects.using(db).rewrite(run_id, rec.seq, rec.stored_as, owner=owner, **fields)


def _held(rec: Record) -> bool:
    """A result of an attempt run in place, held back for the turn's next write."""
    return (
        rec.kind == "step"
        and rec.status == COMPLETED
        and rec.stored_as is not None
        and rec.stored_as[0] == PENDING
    )


def replies(state: TurnState) -> list[Record]:
    """The replies to updates this turn recorded and has not written yet."""
    return [rec for rec in state.unsaved() if rec.kind == "reply" and rec.stored_as is None]


_WRITTEN = (
    "status",
    "attempt",
    "output",
    "error",
    "wake_at",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_heartbeat_at",
    "token",
    "held_until",
    "held_by",
    "flow",
    "redispatches",
)


def write(
    run_id: str,
    state: TurnState,
    settings: conf.Settings,
    *,
    fenced_by: str | None = None,
    namespace: str | None = None,
) -> None:
    """Persist what the turn changed; raise _Stale if a guarded write lost a race.

    With ``fenced_by``, each write is itself conditional on that lease (a flush mid-turn);
    without, the caller's transaction ends with the fenced settle, which rolls it all back.
    """
    db = settings.DATABASE
    limited = flow.started_in_place(state.unsaved())
    if not connections[db].in_atomic_block and (
        limited or any(_settles_member(rec) for rec in state.unsaved())
    ):
        # A fan member settled here and its fan's count go together; an attempt started in
        # place and the slot or rate token it takes, too.
        with transaction.atomic(using=db):
            return write(run_id, state, settings, fenced_by=fenced_by, namespace=namespace)
    checkpoints = Checkpoint.objects.using(db)
    new = []
    answers = replies(state)
    written = state.unsaved()
    entity_ops.send_from_run(run_id, state.new_entity_ops())
    streams.write_from_run(run_id, state.new_stream_writes(), db)
    for rec in state.unsaved():
        if rec.stored_as is None:
            row = _row(run_id, rec)
            if fenced_by is None:
                new.append(row)
            elif not checkpoints.insert_fenced(row, fenced_by):
                raise LeaseLost()
        else:
            fields = {f: getattr(rec, f) for f in _WRITTEN}
            if rec.kind == "event":
                fields["input"] = rec.input  # it names the event received, so no run gets one twice
            if not checkpoints.rewrite(run_id, rec.seq, rec.stored_as, owner=fenced_by, **fields):
                raise _Stale()
    if new:
        checkpoints.add(new)
    if limited:
        flow.admit_in_place(run_id, limited, state)
    _count_fans(run_id, state, db)
    _file_failures(run_id, state, db)
    now = clock.now()
    for rec in answers:
        # False only if the update holds a reply already: the first one recorded stands.
        Signal.objects.using(db).answer(rec.input["update"], run_id, rec.output, now)
    if state.exposed_changed and fenced_by is not None:
        # Mid-turn; at the turn's end the settle writes them with the run's outcome.
        if not Run.objects.using(db).filter(id=run_id, locked_by=fenced_by).update(exposed=state.exposed):
            raise LeaseLost()
        state.exposed_changed = False
    for signal in state.consumed:
        if not Signal.objects.using(db).consume(signal.id, signal.consumed_seq or 0):
            raise _Stale()
    state.consumed.clear()
    turn_messages.send(run_id, state.outgoing)
    state.outgoing.clear()
    send(run_id, state, settings, written, namespace=namespace)


def send(
    run_id: str,
    state: TurnState,
    settings: conf.Settings,
    written: list[Record],
    *,
    namespace: str | None,
    held: Held | None = None,
) -> None:
    """Send the attempts the turn started (after the commit that wrote them) and report the
    positions it wrote; ``held``: an attempt taken for this process as its write read it back."""
    for rec in state.dispatch:
        payload = rec.input or {}
        if payload.get("task") or payload.get("remote"):
            remote = registry.known_step(rec.name) if payload.get("remote") else None
            dispatch.celery_task(
                run_id,
                rec.seq,
                rec.attempt,
                rec.token,
                rec.name,
                payload,
                rec.queue,
                # Reports go to the run's own namespace, whose workers may be the only ones.
                routing.queue_in(settings.DEFAULT_QUEUE, namespace),
                timeout=remote.timeout if remote is not None else None,
                grace=settings.STEP_TIMEOUT_GRACE,
            )
            continue
        if rec.held_by:
            read = held if held is not None and held[0].seq == rec.seq else None
            asyncattempts.launch_held(run_id, rec.seq, rec.attempt, rec.token, rec.held_by, read)
            continue
        dispatch.run_step(run_id, rec.seq, rec.attempt, rec.token, rec.queue)
    state.dispatch.clear()
    observe.positions(run_id, written)


def lone_insert(run_id: str, state: TurnState) -> Checkpoint | None:
    """The new position, when one new position is all the turn has to write before its settle
    (the settle then writes it too: ``RunQuerySet.settle(inserting=)``); else None."""
    rec = _lone(state)
    if rec is None or rec.stored_as is not None or rec.kind == "reply":
        return None
    return _row(run_id, rec)


def lone_held_result(run_id: str, owner: str, state: TurnState, db: str) -> tuple[str, list[Any]] | None:
    """The write of a result run in place and held back, when it is all the turn has to write
    before its settle (the settle then writes it too: ``RunQuerySet.settle(rewriting=)``); else
    None. Under the lease, as ``keep_held_results`` writes it: a result is a fact whether or not
    the settle goes through."""
    rec = _lone(state)
    if rec is None or not _held(rec):
        return None
    fields = {f: getattr(rec, f) for f in _WRITTEN}
    return Checkpoint.objects.using(db).rewriting(run_id, rec.seq, rec.stored_as, owner, fields)


def result_and_start(state: TurnState) -> tuple[Record, Record] | None:
    """The held result of the step just run in place and the next position (an attempt's start,
    say), when they are all a write before the turn's end has to write; else None."""
    unsaved = state.unsaved()
    if (
        len(unsaved) != 2
        or state.consumed
        or state.exposed_changed
        or state.new_entity_ops()
        or state.new_stream_writes()
    ):
        return None
    held, new = unsaved if unsaved[0].stored_as is not None else unsaved[::-1]
    if not _held(held) or new.stored_as is not None or new.kind == "reply":
        return None
    if held.fan is not None or new.fan is not None or held.failures or new.failures:
        return None
    return held, new


def write_result_and_start(
    run_id: str,
    owner: str,
    pair: tuple[Record, Record],
    state: TurnState,
    settings: conf.Settings,
    *,
    namespace: str | None,
) -> None:
    """Write ``result_and_start``'s pair under ``owner``'s lease: one statement on PostgreSQL,
    which commits alone; then send what the turn started. Raise _Stale if the write lost a race
    (the result's position changed, or the lease).

    A limited step that needs the very slot the result freed, with nobody in its line, takes it
    over in that same statement. Any other limited step started, or slot freed, makes it a
    transaction: the pair's statement first, then the new attempt's slot and rate token
    (``admit_in_place``) and the freed slot handed on (gates after the rows, as always)."""
    held, new = pair
    assert held.stored_as is not None  # a held result is stored, as pending
    db = settings.DATABASE
    limited = flow.started_in_place([new])
    written = state.unsaved()
    fields = {f: getattr(held, f) for f in _WRITTEN}
    checkpoints = Checkpoint.objects.using(db)
    rewriting = checkpoints.rewriting(run_id, held.seq, held.stored_as, owner, fields)
    kept = flow.slot_kept(limited, state.freed)
    if kept is not None:
        new.flow, new.flow_key = HELD, kept
        if checkpoints.rewrite_and_insert(
            lines.keeping_slot(db, rewriting, kept, clock.now()), _row(run_id, new)
        ):
            state.freed.clear()
            send(run_id, state, settings, written, namespace=namespace)
            return
        new.flow = new.flow_key = None  # someone waits for it, or the lease is lost: as below
    together = (limited or state.freed) and not connections[db].in_atomic_block
    with transaction.atomic(using=db) if together else nullcontext():
        if not checkpoints.rewrite_and_insert(rewriting, _row(run_id, new)):
            raise _Stale()
        if limited:
            flow.admit_in_place(run_id, limited, state)
        send(run_id, state, settings, written, namespace=namespace)
        hand_off(state)


def _lone(state: TurnState) -> Record | None:
    """The turn's one unsaved position, when nothing else is left to write but the settle (a
    slot it frees is handed on after: ``hand_off``)."""
    unsaved = state.unsaved()
    if len(unsaved) != 1 or state.consumed or state.children or state.outgoing:
        return None
    (rec,) = unsaved
    return None if rec.failures or state.new_entity_ops() or state.new_stream_writes() else rec


def _row(run_id: str, rec: Record) -> Checkpoint:
    return Checkpoint(
        run_id=run_id,
        seq=rec.seq,
        kind=rec.kind,
        name=rec.name,
        queue=rec.queue,
        input=rec.input,
        task=rec.kind == "step" and bool((rec.input or {}).get("task")),
        fan=rec.fan,
        fail_fast=rec.fail_fast,
        flow_key=rec.flow_key,
        **{f: getattr(rec, f) for f in _WRITTEN},
    )


def _settles_member(rec: Record) -> bool:
    """Whether the turn settles a fan member stored pending."""
    return (
        rec.fan is not None
        and rec.stored_as is not None
        and rec.stored_as[0] == PENDING
        and rec.status != PENDING
    )


def _count_fans(run_id: str, state: TurnState, db: str) -> None:
    """Keep the fans' counts (models/fans.py) true to what the turn wrote: a count for each fan
    it positioned whole, its settled members counted out; none for a fan it positioned in part."""
    new: dict[int, list[int]] = {}
    stored: set[int] = set()
    settled: list[tuple[int, int]] = []
    for rec in state.records.values():
        if rec.fan is None:
            continue
        if rec.stored_as is None:
            new.setdefault(rec.fan, [])
            if rec.status == PENDING:
                new[rec.fan].append(rec.seq)
        else:
            stored.add(rec.fan)
            if rec.dirty and _settles_member(rec):
                settled.append((rec.fan, rec.seq))
    if not new and not settled:
        return
    fans = Fan.objects.using(db)
    fans.keep(run_id, {fan: seqs for fan, seqs in new.items() if fan not in stored})
    for fan, seq in settled:
        fans.leave(run_id, fan, seq)
    if reopened := sorted(fan for fan in new if fan in stored):
        fans.forget(run_id, reopened)


def _file_failures(run_id: str, state: TurnState, db: str) -> None:
    """Keep every attempt that failed in this turn in the run's attempt history."""
    rows = [
        AttemptError(
            run_id=run_id,
            seq=rec.seq,
            name=rec.name,
            attempt=failure["attempt"],
            error=failure["error"],
            traceback=failure["traceback"],
            failed_at=failure["at"],
        )
        for rec in state.unsaved()
        for failure in rec.failures
    ]
    if rows:
        AttemptError.objects.using(db).bulk_create(rows)
    for rec in state.unsaved():
        rec.failures.clear()


def hand_off(state: TurnState) -> None:
    """Hand the limit slots this turn freed to the oldest attempts in their lines: in the
    transaction that freed them, after any run row it locks, or right after its commit."""
    for key in state.freed:
        flow.hand_off(key)
    state.freed.clear()


def mark_saved(state: TurnState) -> None:
    for rec in state.records.values():
        rec.stored_as = (rec.status, rec.attempt)
        rec.dirty = False
