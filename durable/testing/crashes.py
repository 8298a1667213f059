"""``durable_env.crash()``: the process dies at a step attempt, so a project can test how its own
workflows recover, as durable's crash-point explorer does for the engine (tests/crashpoints.py).

The death is raised from the step's code as control flow (``ProcessDied``), which no step, body
or engine handler turns into a failure: the transaction open there is rolled back, nothing after
it runs, and what the process held (the turn's lease, the attempt's hold) stays held until it
lapses, as a killed worker's does. The message it was handling goes back to the head of the
queue (``acks_late``), and the env goes on as a fresh process that knows nothing of the dead
one's leases and holds.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..definitions import Step, registry
from ..errors import DurableError, InvalidInput, _ControlFlow
from ..replay.stepscope import step_info

if TYPE_CHECKING:
    from . import DurableEnv

WHEN = ("before", "after")


class ProcessDied(_ControlFlow):
    """The test's process died here (``durable_env.crash``)."""


@dataclass
class Crash:
    """What ``durable_env.crash()`` yields: whether the process died, and where."""

    step: str
    when: str
    attempt: int
    #: ``(run_id, seq)`` of the attempt the process died at, once it did.
    at: tuple[str, int] | None = None

    @property
    def happened(self) -> bool:
        return self.at is not None


@contextmanager
def crash(env: DurableEnv, step: Step | str, when: str, attempt: int) -> Iterator[Crash]:
    definition = _step(step)
    if when not in WHEN:
        raise InvalidInput(f"durable_env.crash(when=...) takes one of {WHEN}, got {when!r}")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise InvalidInput(f"durable_env.crash(attempt=...) takes an attempt number from 1, got {attempt!r}")
    noted = Crash(definition.name, when, attempt)
    original, run_next = definition.fn, env.run_next

    def die() -> None:
        info = step_info()
        if noted.at is None and info.attempt == attempt:
            noted.at = (info.run_id, info.seq)
            raise ProcessDied(f"the process died {when} attempt {attempt} of step {definition.name!r}")

    def receive() -> Any:
        message = env.pending()[0] if env.pending() else None
        try:
            return run_next()
        except ProcessDied:
            if message is not None and message not in env.messages:
                env.messages.insert(0, message)  # unacknowledged: the broker redelivers it
            forget()
            return message

    definition.fn = _dying(original, die, when)
    env.run_next = receive  # type: ignore[method-assign]
    try:
        yield noted
    finally:
        definition.fn = original
        del env.run_next
    if not noted.happened:
        raise DurableError(
            f"durable_env.crash(): attempt {attempt} of step {definition.name!r} did not run inside "
            "the block, so the process never died: run the messages that reach it inside the block"
        )


def forget() -> None:
    """A fresh process: nothing of the dead one's leases, holds, sweep passes, nor what it
    learned of first turns (``first_turns.unfit``)."""
    from ..engine import first_turns, leases, sweeps

    first_turns.unfit.clear()

    leases.active.clear()
    leases.lost.clear()
    leases._renewed.clear()
    leases.attempts.clear()
    leases._watched.clear()
    leases._holder = None
    sweeps.reset_passes()


def _step(step: Step | str) -> Step:
    if isinstance(step, Step):
        return step
    if isinstance(step, str):
        return registry.step(step)
    raise InvalidInput(f"durable_env.crash() takes a @durable.step or its name, got {step!r}")


def _dying(fn: Callable[..., Any], die: Callable[[], None], when: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def dying_async(*args: Any, **kwargs: Any) -> Any:
            if when == "before":
                die()
            result = await fn(*args, **kwargs)
            die()
            return result

        return dying_async

    @functools.wraps(fn)
    def dying(*args: Any, **kwargs: Any) -> Any:
        if when == "before":
            die()
        result = fn(*args, **kwargs)
        die()
        return result

    return dying
