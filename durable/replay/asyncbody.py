"""``async def`` workflow bodies: the body runs as a task on a private loop (``asyncloop``), its
waiting primitives block on futures that only this driver resolves, and only when the loop is
idle. Pure like the rest of the replay core: stdlib asyncio, no ORM, no Celery.

Why answers wait for an idle point even when the history holds them: two branches of a body
(``gather``, ``create_task``) interleave by the order their awaits resolve. On the turn that
first ran them, an answer came when the loop was idle (a step run in place, a result that woke
the run); a replay that resolved recorded answers at once would let a branch run ahead and take
positions in another order. So every turn resolves answers at the same idle points, in position
order. When an idle point resolves only some of the waits (a step done, a signal not yet), a
``resumed`` position records which, and replays resolve exactly those there.

At an idle point, the new step and child positions taken since the last one are decided
together, as ``ctx.all`` decides its members: two or more form a fan (``fan`` = the first one's
position, ``fail_fast``: ``gather``'s default) and are all sent; a lone one may run in place or
locally, as in a plain body.
"""

from __future__ import annotations

import asyncio
import inspect
from asyncio import events
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import Cancelled, DurableError, ErrorCode, NonDeterminismError, Suspend, _ControlFlow
from ..values import decode
from .asyncloop import BodyLoop, task_frame
from .context import CANCEL, Context
from .history import COMPLETED, Record
from .patches import PATCH
from .positions import Pending

#: The kind (and name) of the position that records which waits an idle point resolved.
RESUMED = "resumed"


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a body this module drives."""
    return inspect.iscoroutinefunction(fn)


@dataclass(eq=False, slots=True)
class Wait:
    """A primitive of an async body waiting for its answer at position ``seq``."""

    seq: int
    future: asyncio.Future[Any]
    #: The primitive's answer as things stand: a value, an exception to raise, or ``Pending``.
    probe: Callable[[], Any]
    #: A new step or child position, decided at the next idle point: (record, step or None).
    fresh: tuple[Record, Any] | None = None


class BodyContext(Context):
    """The replay context behind an async body's ``AsyncContext``: cancels are delivered at idle
    points (``Driver``), not at each primitive, and the engine's lookups run off the loop."""

    _driver: Driver

    def _deliver_cancel(self, answer: Any) -> None:
        return None  # a quick primitive answers as it is; a cancel lands where the body waits

    def _find_run(self, run_id: str) -> tuple[str, str] | None:
        with off_loop():
            return super()._find_run(run_id)

    def _guard(self) -> None:
        if self._driver.closing:
            # The body ended: a branch still running is being cancelled, and records nothing.
            raise asyncio.CancelledError()
        super()._guard()


@contextmanager
def off_loop() -> Iterator[None]:
    """Run a query of the engine as sync code: no loop is running in this thread meanwhile (the
    database layer refuses to run under a running loop)."""
    loop = events._get_running_loop()
    events._set_running_loop(None)
    try:
        yield
    finally:
        events._set_running_loop(loop)


class Driver:
    """Runs one turn of an async body: steps its loop, and at each idle point resolves waits,
    delivers a cancel, or suspends the turn."""

    def __init__(self, ctx: BodyContext) -> None:
        self.ctx = ctx
        self.loop = BodyLoop(ctx._stop)
        self.waits: dict[int, Wait] = {}
        self.closing = False
        ctx._driver = self

    async def wait(self, seq: int, probe: Callable[[], Any], fresh: tuple[Record, Any] | None = None) -> Any:
        """Block the calling branch until an idle point answers the primitive at ``seq``."""
        future = self.loop.create_future()
        self.waits[seq] = Wait(seq, future, probe, fresh)
        try:
            return await future
        finally:
            self.waits.pop(seq, None)

    def run(self, body: Coroutine[Any, Any, Any]) -> Any:
        """Run the body's turn; return its value or raise what ended it (as a plain body would)."""
        task = self.loop.create_task(body)
        try:
            self._drive(task)
        finally:
            # New steps no idle point decided were neither sent nor written: forgotten.
            undecided = [w.fresh[0].seq for w in self.waits.values() if w.fresh and w.fresh[1] is not None]
            try:
                self._unwind()
            finally:
                self._close(undecided)
        if task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None:
                raise exc
            return task.result()
        raise self.ctx._stopping or asyncio.CancelledError()

    def _drive(self, task: asyncio.Task[Any]) -> None:
        ctx = self.ctx
        while True:
            self.loop.run_ready()
            if task.done() or ctx._stopping is not None:
                return
            if not self.waits:
                self._stuck(task)
                return
            if not self._idle():
                return

    # -- idle points ------------------------------------------------------------------------

    def _idle(self) -> bool:
        """Decide what this idle point resolves; False when the turn stops here."""
        ctx = self.ctx
        waits = list(self.waits.values())
        if len(waits) > 1:
            waits.sort(key=lambda w: w.seq)
            self._decide_fresh(waits)
        else:
            waits[0].fresh = None  # a lone new position is decided as a plain body's
        recorded = self._recorded_next()
        if recorded is not None and recorded.kind == CANCEL:
            return self._cancel(waits, None)
        if recorded is not None and recorded.kind == RESUMED:
            ctx._position(RESUMED, RESUMED)
            return self._resume_recorded(waits, list((recorded.input or {}).get("seqs", [])))
        answers = self._probe(waits)
        if answers is None:
            return False
        ready = [(w, a) for w, a in zip(waits, answers, strict=True) if not isinstance(a, Pending)]
        summary = next(
            (a for _, a in ready if isinstance(a, DurableError) and a.code == ErrorCode.CANCELLED), None
        )
        if (not ready or summary is not None) and self._cancel(waits, summary if ready else Pending(None)):
            return True
        if len(ready) == len(waits):
            self._resolve(ready)
            return True
        if ready and recorded is None:
            ctx._position(RESUMED, RESUMED)
            rec = ctx._new(RESUMED, RESUMED, status=COMPLETED, input={"seqs": [w.seq for w, _ in ready]})
            rec.finished_at = ctx._now()
            self._resolve(ready)
            return True
        self._suspend(answers)
        return False

    def _decide_fresh(self, waits: list[Wait]) -> None:
        """Make the new step and child positions of this burst one fan when they are two or more
        (what ``ctx.all`` records for its members); a lone one stays as a plain body's."""
        fresh = [w.fresh for w in waits if w.fresh is not None]
        for wait in waits:
            wait.fresh = None
        if len(fresh) < 2:
            return
        first = min(rec.seq for rec, _ in fresh)
        for rec, _ in fresh:
            rec.fan, rec.fail_fast = first, True

    def _recorded_next(self) -> Record | None:
        """The record at the next position, past markers of deleted ``patched()`` calls."""
        records, seq = self.ctx._turn.records, self.ctx._next
        rec = records.get(seq)
        while rec is not None and rec.kind == PATCH:
            seq += 1
            rec = records.get(seq)
        return rec

    def _probe(self, waits: list[Wait]) -> list[Any] | None:
        """Each wait's answer now (running a step due in place or locally); None if the turn
        stopped meanwhile (its lease lost, a local step in a turn replayed ahead...)."""
        answers = []
        for wait in waits:
            try:
                answers.append(wait.probe())
            except (KeyboardInterrupt, SystemExit):
                raise
            except _ControlFlow as stop:
                self.ctx._stop(stop)
                return None
            except Exception as exc:  # noqa: BLE001 - raised at the body's await, as a plain body's
                answers.append(exc)
        return answers

    def _resume_recorded(self, waits: list[Wait], seqs: list[int]) -> bool:
        by_seq = {w.seq: w for w in waits}
        missing = [seq for seq in seqs if seq not in by_seq]
        if missing:
            ctx = self.ctx
            error = NonDeterminismError(
                f"position {ctx._here} records that the body's waits at positions {seqs} were resumed "
                f"there, but the body does not wait at {missing}: the workflow's code changed under "
                "a running run (check your workflow is deterministic)",
                details={"seq": ctx._here, "resumed": seqs, "waiting": sorted(by_seq)},
            )
            ctx._nondeterminism = error
            ctx._stop(error)
            return False
        chosen = [by_seq[seq] for seq in seqs]
        answers = self._probe(chosen)
        if answers is None:
            return False
        if any(isinstance(a, Pending) for a in answers):
            self._suspend(answers)
            return False
        self._resolve(list(zip(chosen, answers, strict=True)))
        return True

    def _cancel(self, waits: list[Wait], summary: Any) -> bool:
        """Raise ``Cancelled`` at every wait if an interrupting cancel is delivered here (recorded
        here by an earlier turn, or due now); False if it is not."""
        try:
            Context._deliver_cancel(self.ctx, summary)
        except Cancelled as cancelled:
            for wait in waits:
                if not wait.future.done():
                    wait.future.set_exception(Cancelled(cancelled.message))
            return True
        return False

    def _resolve(self, ready: list[tuple[Wait, Any]]) -> None:
        """Answer the waits, in position order: their branches resume in that order."""
        for wait, answer in ready:
            self.waits.pop(wait.seq, None)
            if wait.future.done():
                continue
            if isinstance(answer, BaseException):
                wait.future.set_exception(answer)
            else:
                # Read from the history as stored, on the first turn as on a replay (see _settle).
                wait.future.set_result(decode(answer))

    def _suspend(self, answers: list[Any]) -> None:
        ctx = self.ctx
        for answer in answers:
            if isinstance(answer, Pending) and answer.wake_at is not None:
                ctx._turn.wakes.append(answer.wake_at)
                if answer.timer:
                    ctx._turn.timers.append(answer.wake_at)
        ctx._stop(Suspend())

    def _stuck(self, task: asyncio.Task[Any]) -> None:
        """Every branch waits for something no primitive resolves (a future, an event, a lock
        that nothing will release): the run fails, naming what the body awaits."""
        called, where = task_frame(_innermost(task))
        what = called or "an awaitable that is not a durable primitive"
        self.ctx._stop(
            DurableError(
                f"the workflow body awaits {what} at {where}, which nothing in the body resolves: "
                "await only durable primitives in a body (or tasks and futures that they resolve)",
                code=ErrorCode.NONDETERMINISTIC_AWAIT,
                details={"awaited": what, "at": where},
            )
        )

    # -- the end of the turn -----------------------------------------------------------------

    def _unwind(self) -> None:
        """Stop the branches still waiting with what stopped the turn, as a plain body's next
        primitive would raise it (its ``finally`` clauses run; nothing more is recorded)."""
        stop = self.ctx._stopping
        if stop is None:
            return
        for wait in sorted(self.waits.values(), key=lambda w: w.seq):
            if not wait.future.done():
                wait.future.set_exception(Suspend() if isinstance(stop, Suspend) else stop)
        self.loop.run_ready()

    def _close(self, undecided: list[int]) -> None:
        """Cancel what is left (a branch nobody awaited, one blocked on a lock), quietly."""
        self.closing = True
        loop = self.loop
        try:
            for _ in range(3):
                left = [t for t in loop.tasks if not t.done()]
                if not left:
                    break
                for task in left:
                    task.cancel()
                loop.run_ready()
            for seq in undecided:
                self.ctx._turn.records.pop(seq, None)
            for task in loop.tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: the turn's verdict already says what counts
        finally:
            loop.close()


def _innermost(task: asyncio.Task[Any]) -> asyncio.Task[Any]:
    """The task at the end of the chain of tasks ``task`` awaits (``await other_task``)."""
    seen = set()
    while id(task) not in seen:
        seen.add(id(task))
        waiter = getattr(task, "_fut_waiter", None)
        if isinstance(waiter, asyncio.Task):
            task = waiter
            continue
        children = getattr(waiter, "_children", None)  # gather()'s future
        pending = [c for c in children or [] if isinstance(c, asyncio.Task) and not c.done()]
        if not pending:
            break
        task = pending[0]
    return task
