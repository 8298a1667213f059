"""Composition primitives of the replay context: fans (defer / all / all_settled / map), child
runs and continue-as-new. Pure like the rest of the replay core: no ORM, no Celery.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..definitions import Step, Workflow, registry
from ..errors import ChildFailed, DurableError, GatherError, InvalidInput, _ControlFlow
from ..values import decode
from .history import COMPLETED, FAILED, ChildStart, Record
from .positions import Pending, Positions

_CHILD_IDS = uuid.UUID("6f1c1d0e-8a55-4c8e-9a47-1f0d7b2d3c11")


@dataclass(frozen=True)
class Deferred:
    """Work described by ``ctx.defer`` / ``ctx.defer_child``; it runs when gathered."""

    kind: str  # "step" | "child"
    target: Step | Workflow
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """How one member of ``ctx.all_settled`` ended."""

    ok: bool
    value: Any = None
    error: DurableError | None = None


class ContinueAsNew(_ControlFlow):
    """Ends this run and starts a fresh one of the same workflow with ``input``."""

    def __init__(self, input: Any) -> None:
        super().__init__()
        self.input = input


CANCEL, INTERRUPT, ABANDON = "cancel", "interrupt", "abandon"
#: What a child may become when its parent ends unfinished (``on_parent_close``).
PARENT_CLOSE = (CANCEL, INTERRUPT, ABANDON)


def parent_close_policy(value: Any) -> str:
    if value not in PARENT_CLOSE:
        raise InvalidInput(
            f"on_parent_close takes one of {PARENT_CLOSE} (what the child becomes when its parent "
            f"ends first), got {value!r}"
        )
    return str(value)


def child_run_id(parent_id: str, seq: int) -> str:
    """The id of the child started at ``seq``: the same on every replay, so never started twice."""
    return uuid.uuid5(_CHILD_IDS, f"{parent_id}:{seq}").hex


def _workflow(target: Workflow | str) -> Workflow:
    if isinstance(target, Workflow):
        return registry.workflow(target.name, target.version)
    if isinstance(target, str):
        return registry.workflow(target)
    raise InvalidInput(f"a child must be a @durable.workflow or its name, got {target!r}")


class Composition(Positions):
    """The fan, child and continue-as-new primitives of ``durable.Context``."""

    def defer(self, step: Step | str, *args: Any, **kwargs: Any) -> Deferred:
        """Describe a step for ``ctx.all`` / ``ctx.all_settled``; nothing runs yet."""
        return Deferred("step", self._step_definition(step), args, kwargs)

    def defer_child(
        self,
        workflow: Workflow | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        on_parent_close: str = CANCEL,
    ) -> Deferred:
        """Describe a child run for ``ctx.all`` / ``ctx.all_settled``; nothing starts yet."""
        policy = parent_close_policy(on_parent_close)
        return Deferred("child", _workflow(workflow), (input,), {"run_id": run_id, "on_parent_close": policy})

    def all(self, deferreds: Any) -> list[Any]:
        """Run the members in parallel; return their outputs in order, or raise GatherError."""
        return self._gather(list(deferreds), fail_fast=True)

    def all_settled(self, deferreds: Any) -> list[Outcome]:
        """Run the members in parallel; return how each ended, in order."""
        return self._gather(list(deferreds), fail_fast=False)

    def map(self, step: Step | str, items: Any) -> list[Any]:
        """``ctx.all([ctx.defer(step, item) for item in items])``."""
        return self.all([self.defer(step, item) for item in items])

    def child(
        self,
        workflow: Workflow | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        on_parent_close: str = CANCEL,
    ) -> Any:
        """Start a child run and wait for its output; raise ChildFailed if it does not complete.
        ``on_parent_close``: what the child becomes if this run ends first ("cancel",
        "interrupt": cancelled with ``interrupt=True``, or "abandon": left running)."""
        rec = self._child_position(
            _workflow(workflow), input, run_id, fan=None, fail_fast=False, on_parent_close=on_parent_close
        )
        return self._settle(self._resolve_child(rec))

    def start_child(
        self,
        workflow: Workflow | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        on_parent_close: str = CANCEL,
    ) -> str:
        """Start a child run and return its id without waiting for it (``on_parent_close`` as
        for ``child``)."""
        definition = _workflow(workflow)
        policy = parent_close_policy(on_parent_close)
        rec = self._position("child", definition.name)
        if rec is None:
            rec = self._start_child(definition, input, run_id, policy)
            rec.status, rec.output, rec.finished_at = COMPLETED, rec.input["run_id"], self._now()
        child_id: str = rec.input["run_id"]
        return child_id

    def continue_as_new(self, input: Any = None) -> None:
        """Finish this run and start a fresh one of the same workflow with ``input``."""
        self._guard()
        raise self._stop(ContinueAsNew(self._storable(input, "the input of continue_as_new()")))

    # -- internals --------------------------------------------------------------------------

    def _gather(self, deferreds: list[Deferred], *, fail_fast: bool) -> list[Any]:
        first = self._fan_first(deferreds)
        # Each member answers before the next takes its position: a local member runs there.
        answers = [self._member(member, first, fail_fast, send=True)() for member in deferreds]
        gathered: list[Any] = self._settle(self._gathered(answers, fail_fast=fail_fast))
        return gathered

    def _fan_first(self, deferreds: list[Deferred]) -> int:
        """The position of a fan's first member (its ``fan``), once every member is checked."""
        for member in deferreds:
            if not isinstance(member, Deferred):
                raise InvalidInput(f"ctx.all() takes what ctx.defer() returns, got {member!r}")
        return self._next

    def _member(self, member: Deferred, first: int, fail_fast: bool, *, send: bool) -> Callable[[], Any]:
        """Take the position of a fan's member; return how to ask for its answer."""
        if member.kind == "step":
            step = member.target
            assert isinstance(step, Step)
            rec = self._step_position(
                step, member.args, member.kwargs, fan=first, fail_fast=fail_fast, send=send
            )
            return lambda: self._resolve_step(rec, step)
        assert isinstance(member.target, Workflow)
        rec = self._child_position(
            member.target,
            member.args[0],
            member.kwargs.get("run_id"),
            fan=first,
            fail_fast=fail_fast,
            on_parent_close=member.kwargs.get("on_parent_close", CANCEL),
        )
        return lambda: self._resolve_child(rec)

    def _gathered(self, answers: list[Any], *, fail_fast: bool) -> Any:
        """A fan's answer from its members': the failure, the earliest wait, or the outputs."""
        # Every answer goes through _settle, so a cancel delivered after the fan replays there.
        failures = [a for a in answers if isinstance(a, DurableError)]
        if fail_fast and failures:
            return self._failure_of_all(failures)
        waiting = [a for a in answers if not isinstance(a, DurableError) and isinstance(a, Pending)]
        if waiting:
            return min(waiting, key=lambda a: (a.wake_at is None, a.wake_at))
        if fail_fast:
            return answers
        return [
            Outcome(False, error=a) if isinstance(a, DurableError) else Outcome(True, decode(a))
            for a in answers
        ]

    def _failure_of_all(self, failures: list[DurableError]) -> GatherError:
        error = GatherError(failures)
        seqs = [seq for failure in failures for seq in self._turn.raised.get(id(failure), [])]
        self._turn.raised[id(error)] = seqs
        return error

    def _child_position(
        self,
        definition: Workflow,
        input: Any,
        run_id: str | None,
        *,
        fan: int | None,
        fail_fast: bool,
        on_parent_close: str = CANCEL,
    ) -> Record:
        policy = parent_close_policy(on_parent_close)
        rec = self._position("child", definition.name)
        if rec is None:
            rec = self._start_child(definition, input, run_id, policy)
            rec.fan, rec.fail_fast = fan, fail_fast
        return rec

    def _start_child(self, definition: Workflow, input: Any, run_id: str | None, policy: str) -> Record:
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise InvalidInput(f"a child's run_id must be a non-empty string, got {run_id!r}")
        payload = self._storable(input, f"the input of child workflow {definition.name!r}")
        child_id = run_id or child_run_id(self._facts.id, self._here)
        stored_policy = None if policy == CANCEL else policy
        started = {"run_id": child_id, "version": definition.version}
        if stored_policy is not None:
            started["on_parent_close"] = stored_policy
        rec = self._new("child", definition.name, input=started)
        rec.enqueued_at = self._now()
        self._turn.children.append(
            ChildStart(child_id, definition.name, definition.version, payload, rec.seq, stored_policy)
        )
        return rec

    def _resolve_child(self, rec: Record) -> Any:
        if rec.status == COMPLETED:
            return rec.output
        if rec.status == FAILED:
            return self._failure(ChildFailed(cause=rec.error), rec)
        # The child's end settles this position and wakes the run; the reconcile wake backs it up.
        return Pending(None)
