"""``durable.AsyncContext``: what an ``async def`` workflow body receives.

The primitives that may wait are coroutines to await (``await ctx.step(charge, order)``), so
``asyncio.gather`` and ``asyncio.create_task`` take them; each takes its position when its
coroutine first runs, and answers at the loop's next idle point (``asyncbody``). The quick ones,
which never wait, are the plain context's own calls.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..annotated import shaped, signature
from ..definitions import Step, Workflow
from .asyncbody import BodyContext, Driver
from .composition import CANCEL, Deferred, Outcome, _workflow
from .context import Context
from .updates import Signal, Update, received_message, received_update

#: The primitives that never wait: called as in a plain body, not awaited.
QUICK = frozenset(
    {
        "run_id",
        "workflow_name",
        "version",
        "namespace",
        "is_replaying",
        "logger",
        "now",
        "uuid4",
        "random",
        "patched",
        "deprecate_patch",
        "defer",
        "defer_child",
        "start_child",
        "start",
        "signal",
        "publish_event",
        "signal_entity",
        "reply",
        "expose",
        "write_stream",
        "close_stream",
        "upsert_search_attributes",
        "continue_as_new",
    }
)


class AsyncContext:
    """The context of an ``async def`` body: ``await`` the primitives that wait (``step``,
    ``sleep``, ``sleep_until``, ``wait_for_signal``, ``wait_for_any_signal``, ``wait_for_event``,
    ``wait_for_update``, ``child``, ``all``, ``all_settled``, ``map``, ``call_entity``); call the
    others (``QUICK``) as in a plain body."""

    __slots__ = ("_ctx", "_driver")

    def __init__(self, ctx: BodyContext, driver: Driver) -> None:
        self._ctx = ctx
        self._driver = driver

    def __getattr__(self, name: str) -> Any:
        if name in QUICK:
            return getattr(self._ctx, name)
        raise AttributeError(f"durable.AsyncContext has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({*QUICK, *(n for n in type(self).__dict__ if not n.startswith("_"))})

    async def step(self, step: Step | str, *args: Any, **kwargs: Any) -> Any:
        """Run ``step`` and return its recorded output (``ctx.step``)."""
        ctx = self._ctx
        definition = ctx._step_definition(step)
        known = len(ctx._turn.records)
        rec = ctx._step_position(definition, args, kwargs, fan=None, fail_fast=False, send=False)
        fresh = (rec, definition) if len(ctx._turn.records) > known else None
        value = await self._driver.wait(rec.seq, lambda: ctx._resolve_step(rec, definition), fresh)
        return shaped(value, signature(definition.fn).returns)

    async def sleep(self, duration: Any) -> None:
        """Wait durably for ``duration`` (``ctx.sleep``)."""
        rec = self._ctx._sleep_position(duration)
        await self._driver.wait(rec.seq, lambda: self._ctx._resolve_timer(rec))

    async def sleep_until(self, when: datetime) -> None:
        """Wait durably until the aware datetime ``when`` (``ctx.sleep_until``)."""
        rec = self._ctx._sleep_until_position(when)
        await self._driver.wait(rec.seq, lambda: self._ctx._resolve_timer(rec))

    async def wait_for_signal(self, name: str, timeout: Any = None) -> Any:
        """Return the payload of the next signal ``name`` (``ctx.wait_for_signal``)."""
        probe = self._ctx._signal_wait(name, timeout)
        return await self._driver.wait(self._ctx._here, probe)

    async def wait_for_any_signal(self, names: Any, timeout: Any = None) -> tuple[str, Any]:
        """Return ``(name, payload)`` of the oldest signal of ``names`` (``ctx.wait_for_any_signal``)."""
        probe = self._ctx._any_signal_wait(names, timeout)
        name, payload = await self._driver.wait(self._ctx._here, probe)
        return name, payload

    async def wait_for_event(
        self, name: str, match: dict[str, Any] | None = None, timeout: Any = None
    ) -> Any:
        """Return the payload of the next matching event ``name`` (``ctx.wait_for_event``)."""
        probe = self._ctx._event_wait(name, match, timeout)
        return await self._driver.wait(self._ctx._here, probe)

    async def wait_for_update(self, name: str, timeout: Any = None) -> Update:
        """Return the next update ``name`` (``ctx.wait_for_update``); answer it with ``ctx.reply``."""
        probe = self._ctx._update_wait(name, timeout)
        return received_update(await self._driver.wait(self._ctx._here, probe))

    async def wait_for_message(
        self, *, signals: Any = (), updates: Any = (), timeout: Any = None
    ) -> Signal | Update:
        """Return the oldest signal or update of the names (``ctx.wait_for_message``)."""
        probe = self._ctx._message_wait(signals, updates, timeout)
        return received_message(await self._driver.wait(self._ctx._here, probe))

    async def child(
        self,
        workflow: Workflow | str,
        input: Any = None,
        *,
        run_id: str | None = None,
        on_parent_close: str = CANCEL,
    ) -> Any:
        """Start a child run and return its output (``ctx.child``)."""
        ctx = self._ctx
        known = len(ctx._turn.records)
        rec = ctx._child_position(
            _workflow(workflow), input, run_id, fan=None, fail_fast=False, on_parent_close=on_parent_close
        )
        fresh = (rec, None) if len(ctx._turn.records) > known else None
        return await self._driver.wait(rec.seq, lambda: ctx._resolve_child(rec), fresh)

    async def call_entity(self, name: str, key: str, op: str, arg: Any = None, timeout: Any = None) -> Any:
        """Send ``op(arg)`` to an entity and return its result (``ctx.call_entity``)."""
        rec = self._ctx._entity_position(name, key, op, arg, call=True, timeout=timeout)
        return await self._driver.wait(rec.seq, lambda: self._ctx._resolve_entity(rec))

    async def all(self, deferreds: Any) -> list[Any]:
        """Run the members in parallel; return their outputs, or raise GatherError (``ctx.all``)."""
        return await self._gather(list(deferreds), fail_fast=True)  # type: ignore[no-any-return]

    async def all_settled(self, deferreds: Any) -> list[Outcome]:
        """Run the members in parallel; return how each ended (``ctx.all_settled``)."""
        return await self._gather(list(deferreds), fail_fast=False)  # type: ignore[no-any-return]

    async def map(self, step: Step | str, items: Any) -> list[Any]:
        """``await ctx.all([ctx.defer(step, item) for item in items])``."""
        return await self.all([self._ctx.defer(step, item) for item in items])

    async def _gather(self, deferreds: list[Deferred], *, fail_fast: bool) -> Any:
        ctx = self._ctx
        first = ctx._fan_first(deferreds)
        members = [ctx._member(member, first, fail_fast, send=False) for member in deferreds]
        if not members:
            return []
        return await self._driver.wait(
            first, lambda: ctx._gathered([member() for member in members], fail_fast=fail_fast)
        )


def run(fn: Callable[..., Any], ctx: Context, input: Any) -> Any:
    """Run one turn of the async body ``fn`` against ``ctx`` (a ``BodyContext``): return what it
    returned, or raise what ended it, as calling a plain body would."""
    assert isinstance(ctx, BodyContext)
    driver = Driver(ctx)
    return driver.run(fn(AsyncContext(ctx, driver), input))
