"""``ctx.signal``, ``ctx.publish_event`` and ``ctx.start``: a run talks to other runs exactly once
per position. The position and its message (``TurnState.outgoing``) are written in one fenced
transaction by the executor, so a replay never sends again and a turn that lost its lease sends
nothing.

A signal to a run that does not exist or has finished records that failure at its position and
raises ``RunNotFound`` / ``RunFinished`` into the body, on the first turn as on replays.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..definitions import Workflow
from ..errors import DurableError, InvalidInput, RunFinished, RunNotFound
from ..guards import run_id as checked_run_id
from ..guards import text
from ..statuses import TERMINAL
from ..values import stored
from .composition import _workflow
from .history import COMPLETED, FAILED, Outgoing, Record
from .positions import Positions

SEND_SIGNAL, SEND_EVENT, START = "send_signal", "send_event", "start"
#: The length of the name and id columns of runs, signals and events.
NAME_LENGTH = 255
_STARTED_IDS = uuid.UUID("2b0f3c5e-77d1-4a39-8f0e-5c6a1e9d4b27")
_RAISED = {cls.__name__: cls for cls in (RunNotFound, RunFinished, InvalidInput)}


def started_run_id(run_id: str, seq: int) -> str:
    """The id of the run ``ctx.start`` started at ``seq``: the same on every replay."""
    return uuid.uuid5(_STARTED_IDS, f"{run_id}:{seq}").hex


class Messages(Positions):
    """Mixed into ``Context``."""

    def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        """Send signal ``name`` to run ``run_id`` once, when this turn commits."""
        target = checked_run_id(run_id, max_length=NAME_LENGTH, reserved_ok=True)
        text(name, "signal name", max_length=NAME_LENGTH, kind="name")
        stored = self._payload(payload, f"the payload of signal {name!r}")
        if target == self._facts.id:
            raise InvalidInput("ctx.signal() to the run itself: keep the value in a variable instead")
        rec = self._position(SEND_SIGNAL, name)
        if rec is None:
            found = self._find_run(target)
            if found is None:
                rec = self._refused(
                    SEND_SIGNAL, name, RunNotFound(f"no run has id {target!r}; nothing was sent")
                )
            elif found[1] in TERMINAL:
                rec = self._refused(
                    SEND_SIGNAL,
                    name,
                    RunFinished(f"run {target!r} has already finished ({found[1]}); nothing was sent"),
                )
            else:
                rec = self._sent(SEND_SIGNAL, name, {"run_id": target, "payload": stored})
                self._turn.outgoing.append(Outgoing("signal", rec.seq, target, name, stored))
        self._settle(self._answer(rec))

    def publish_event(self, name: str, payload: Any = None) -> None:
        """Publish event ``name`` once, when this turn commits (see ``durable.publish_event``)."""
        text(name, "event name", max_length=NAME_LENGTH, kind="name")
        stored = self._payload(payload, f"the payload of event {name!r}")
        if self._position(SEND_EVENT, name) is None:
            rec = self._sent(SEND_EVENT, name, {"payload": stored})
            self._turn.outgoing.append(Outgoing("event", rec.seq, "", name, stored))

    def start(self, workflow: Workflow | str, input: Any = None, *, run_id: str | None = None) -> str:
        """Start a run of ``workflow`` once, when this turn commits, and return its id. It is no
        child: it has no parent, and this run neither waits for it nor hears how it ends."""
        definition = _workflow(workflow)
        if run_id is not None:
            run_id = checked_run_id(run_id, max_length=NAME_LENGTH, reserved_ok=False)
        stored = self._payload(input, f"the input of workflow {definition.name!r}")
        definition.check_input(stored)
        rec = self._position(START, definition.name)
        if rec is None:
            target = run_id or started_run_id(self._facts.id, self._here)
            found = self._find_run(target)
            if found is not None and found[0] != definition.name:
                error = InvalidInput(
                    f"run id {target!r} already belongs to workflow {found[0]!r}, not "
                    f"{definition.name!r}; pick another run_id"
                )
                rec = self._refused(START, definition.name, error)
            else:
                rec = self._sent(START, definition.name, {"run_id": target, "version": definition.version})
                rec.output = target
                if found is None:  # the same id again is the run that exists, unchanged
                    self._turn.outgoing.append(
                        Outgoing(
                            "start",
                            rec.seq,
                            target,
                            definition.name,
                            stored,
                            version=definition.version,
                            namespace=self._facts.namespace,
                        )
                    )
        started: str = self._settle(self._answer(rec))
        return started

    # -- internals --------------------------------------------------------------------------

    def _payload(self, value: Any, what: str) -> Any:
        return stored(value, what=what, max_bytes=self._limits.max_payload_bytes)

    def _find_run(self, run_id: str) -> tuple[str, str] | None:
        find = self._turn.find_run
        return find(run_id) if find is not None else None

    def _sent(self, kind: str, name: str, input: dict[str, Any]) -> Record:
        rec = self._new(kind, name, status=COMPLETED, input=input)
        rec.finished_at = self._now()
        return rec

    def _refused(self, kind: str, name: str, error: DurableError) -> Record:
        rec = self._new(kind, name, status=FAILED, error=error.to_dict())
        rec.finished_at = self._now()
        return rec

    def _answer(self, rec: Record) -> Any:
        if rec.status != FAILED:
            return rec.output
        error = rec.error or {}
        cls = _RAISED.get(str(error.get("type")), DurableError)
        return self._failure(
            cls(error.get("message"), code=error.get("code"), details=error.get("details")), rec
        )
