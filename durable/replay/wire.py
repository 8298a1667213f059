"""A remote turn as JSON: the turn message a worker with no database replays, and the decision it
sends back (protocol v1, ``turn.json`` and ``decision.json``).

Pure data conversion, so the worker that replays needs neither the ORM nor the engine. With a
codec, every payload (what a row's payload column holds) travels sealed in the envelope the rows
use (``codecs.seal``); without one the messages are plain JSON, as they always were.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from .. import codecs
from ..codecs import Codec
from ..statuses import Decided
from .history import BufferedSignal, ChildStart, Decision, Limits, Outgoing, Record
from .turnstate import RunFacts, TurnState

PROTOCOL = 1

_TIMES = ("wake_at", "enqueued_at", "started_at", "finished_at", "last_heartbeat_at", "held_until")


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _parse(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def limits_out(limits: Limits) -> dict[str, Any]:
    out = dataclasses.asdict(limits)
    for name, value in out.items():
        if isinstance(value, timedelta):
            out[name] = value.total_seconds()
    out["remote_queues"] = sorted(limits.remote_queues)
    if not limits.sealed_payloads:
        del out["sealed_payloads"]  # a turn without a codec stays what it was
    return out


def limits_in(raw: dict[str, Any]) -> Limits:
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Limits):
        if f.name not in raw:
            continue
        value = raw[f.name]
        if f.name == "remote_queues":
            value = frozenset(value)
        elif f.type in ("timedelta", timedelta):  # sent as seconds
            value = timedelta(seconds=value)
        fields[f.name] = value
    return Limits(**fields)


def record_out(rec: Record, codec: Codec | None = None) -> dict[str, Any]:
    out = dataclasses.asdict(rec)
    out["input"] = codecs.sealed(rec.input, codec)
    out["output"] = codecs.sealed(rec.output, codec)
    for name in _TIMES:
        out[name] = _when(getattr(rec, name))
    out["stored_as"] = list(rec.stored_as) if rec.stored_as is not None else None
    out["failures"] = [{**f, "at": _when(f["at"])} for f in rec.failures]
    return out


def record_in(raw: dict[str, Any], codec: Codec | None = None) -> Record:
    fields = dict(raw)
    fields["input"] = codecs.opened(fields.get("input"), codec)
    fields["output"] = codecs.opened(fields.get("output"), codec)
    for name in _TIMES:
        fields[name] = _parse(fields.get(name))
    stored = fields.get("stored_as")
    fields["stored_as"] = (stored[0], stored[1]) if stored else None
    fields["failures"] = [{**f, "at": _parse(f["at"])} for f in fields.get("failures") or []]
    known = {f.name for f in dataclasses.fields(Record)}
    return Record(**{k: v for k, v in fields.items() if k in known})


def turn_message(
    facts: RunFacts,
    records: dict[int, Record],
    signals: list[BufferedSignal],
    exposed: dict[str, Any],
    limits: Limits,
    *,
    turn: str,
    wakes: int,
    reply_to: str,
    lease_seconds: float,
    now: datetime,
    codec: Codec | None = None,
) -> dict[str, Any]:
    """What a remote worker needs to replay one turn of a run (``turn.json``), its payloads
    sealed under ``codec`` when there is one."""
    return {
        "protocol": PROTOCOL,
        "turn": turn,
        "wakes": wakes,
        "reply_to": reply_to,
        "lease_seconds": lease_seconds,
        "sent_at": _when(now),
        "limits": limits_out(limits),
        "run": {
            "id": facts.id,
            "workflow": facts.workflow,
            "version": facts.version,
            "namespace": facts.namespace,
            "input": codecs.sealed(facts.input, codec),
            "deadline": _when(facts.deadline),
            "cancel_request": facts.cancel_request,
        },
        "records": [record_out(rec, codec) for rec in records.values()],
        "signals": [{**dataclasses.asdict(s), "payload": codecs.sealed(s.payload, codec)} for s in signals],
        "exposed": codecs.sealed(exposed, codec),
    }


def facts_in(message: dict[str, Any], codec: Codec | None = None) -> RunFacts:
    """The run a turn message is for; ``PayloadUndecodable`` when ``codec`` opens not its input."""
    run = message["run"]
    return RunFacts(
        run["id"],
        run["workflow"],
        run["version"],
        run.get("namespace"),
        codecs.opened(run.get("input"), codec),
        _parse(run.get("deadline")),
        run.get("cancel_request"),
    )


def state_in(message: dict[str, Any], codec: Codec | None = None) -> TurnState:
    """The state a remote turn starts from; ``PayloadUndecodable`` when ``codec`` opens not one
    of its payloads."""
    records = [record_in(raw, codec) for raw in message.get("records") or []]
    signals = [
        BufferedSignal(**{**raw, "payload": codecs.opened(raw.get("payload"), codec)})
        for raw in message.get("signals") or []
    ]
    exposed = codecs.opened(message.get("exposed"), codec)
    return TurnState(
        records={rec.seq: rec for rec in records},
        signals=signals,
        exposed=dict(exposed or {}),
        read_at=_parse(message.get("sent_at")),
    )


def decision_message(
    turn: dict[str, Any], state: TurnState, decision: Decision, codec: Codec | None = None
) -> dict[str, Any]:
    """What a remote turn decided and changed (``decision.json``), for a worker with the database;
    its payloads sealed under ``codec`` when there is one."""
    return {
        "protocol": PROTOCOL,
        "turn": turn["turn"],
        "run_id": turn["run"]["id"],
        "wakes": turn["wakes"],
        "status": str(decision.status),
        "output": codecs.sealed(decision.output, codec),
        "error": decision.error,
        "wake_at": _when(decision.wake_at),
        "failed_seqs": list(decision.failed_seqs),
        "next_input": codecs.sealed(decision.next_input, codec),
        "blocked": decision.blocked,
        "records": [record_out(rec, codec) for rec in state.unsaved()],
        "dispatch": [rec.seq for rec in state.dispatch],
        "consumed": [{"id": s.id, "seq": s.consumed_seq} for s in state.consumed],
        "children": [
            {**dataclasses.asdict(c), "input": codecs.sealed(c.input, codec)} for c in state.children
        ],
        "outgoing": [
            {**dataclasses.asdict(o), "payload": codecs.sealed(o.payload, codec)} for o in state.outgoing
        ],
        "search_attributes": state.search_attributes,
        "exposed": codecs.sealed(state.exposed, codec) if state.exposed_changed else None,
        "freed": list(state.freed),
    }


def decided_in(message: dict[str, Any], codec: Codec | None = None) -> tuple[TurnState, Decision]:
    """The state to persist and the decision of a ``durable.decision`` message;
    ``PayloadUndecodable`` when ``codec`` opens not one of its payloads."""
    records = {raw["seq"]: record_in(raw, codec) for raw in message.get("records") or []}
    state = TurnState(
        records=records,
        dispatch=[records[seq] for seq in message.get("dispatch") or []],
        consumed=[
            BufferedSignal(raw["id"], "", None, consumed_seq=raw["seq"])
            for raw in message.get("consumed") or []
        ],
        whole_history=False,
        children=[
            ChildStart(**{**raw, "input": codecs.opened(raw.get("input"), codec)})
            for raw in message.get("children") or []
        ],
        outgoing=[
            Outgoing(**{**raw, "payload": codecs.opened(raw.get("payload"), codec)})
            for raw in message.get("outgoing") or []
        ],
        search_attributes=message.get("search_attributes"),
        exposed=dict(codecs.opened(message.get("exposed"), codec) or {}),
        exposed_changed=message.get("exposed") is not None,
        freed=list(message.get("freed") or []),
    )
    decision = Decision(
        Decided(message["status"]),
        output=codecs.opened(message.get("output"), codec),
        error=message.get("error"),
        wake_at=_parse(message.get("wake_at")),
        failed_seqs=list(message.get("failed_seqs") or []),
        next_input=codecs.opened(message.get("next_input"), codec),
        blocked=bool(message.get("blocked")),
    )
    return state, decision
