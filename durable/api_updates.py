"""Updates that answer and queries of what a run exposed, from views, shells and tasks.

Waiting reads one indexed row per short poll, like ``durable.result``; under ``durable_env``
nothing runs meanwhile, so a wait answers from what is already there or raises WaitTimeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import conf, guards
from .calls import FIRST_POLL, column_length, name_of, next_poll, payload_of, run_id_of
from .durations import optional_duration
from .errors import RunFinished, WaitTimeout
from .statuses import TERMINAL
from .values import decode

#: What a look returns while the awaited value is not there yet.
NOT_YET = object()


@dataclass(frozen=True)
class Awaited:
    """A wait for a value, as ``update(wait=...)`` and ``query(timeout=...)`` poll for it (``until``
    in a thread, ``durable.api_async`` on an event loop): one ``look`` is one short read."""

    #: Reads once: the value, or ``NOT_YET``; raises RunFinished when it can no longer come.
    look: Callable[[], Any]
    #: Seconds to wait for it (None: answer from the first look).
    limit: float | None
    #: The WaitTimeout to raise, given whether the test harness is why nothing came.
    late: Callable[[bool], WaitTimeout]


def update(
    run_id: str, name: str, payload: Any = None, *, wait: Any = None, idempotency_key: str | None = None
) -> Any:
    """Send update ``name`` to the run, vetted first by the workflow's validator for ``name``.

    A refusal raises UpdateRejected and stores nothing. An accepted update reaches the body's
    ``ctx.wait_for_update(name)``, or its ``ctx.wait_for_signal(name)`` as a signal. Without
    ``wait``, return the update's id. With ``wait`` (a duration), block until the body answers
    with ``ctx.reply(update, value)`` and return ``value`` (None once a signal wait took it,
    as that never answers); WaitTimeout past it, RunFinished if the run ends without answering.
    The same ``idempotency_key`` again for that run sends nothing new and answers with the first
    update's id (or reply). Waiting inside ``transaction.atomic()`` is refused: the update is
    only sent when the transaction commits.
    """
    sent = send_update(run_id, name, payload, wait=wait, idempotency_key=idempotency_key)
    return until(sent) if isinstance(sent, Awaited) else sent


def send_update(
    run_id: str, name: str, payload: Any = None, *, wait: Any = None, idempotency_key: str | None = None
) -> Any:
    """Send the update as ``update`` does; its id without ``wait``, else the wait for its reply."""
    from .engine import updates

    run_id = run_id_of(run_id)
    name_of(name, "update name", "Signal")
    stored = payload_of(payload, f"the payload of update {name!r}")
    key = idempotency_key_of(idempotency_key)
    limit = _seconds(wait, "wait")
    if limit is not None:
        _outside_transactions("update(wait=...)")
    update_id = updates.update(run_id, name, stored, idempotency_key=key)
    if limit is None:
        return update_id
    seen: dict[str, Any] = {}

    def look() -> Any:
        answer = updates.answer(update_id)
        seen["status"], seen["taken"] = answer.run_status, answer.taken
        if answer.replied:
            return decode(answer.reply)
        if answer.taken_as_signal:
            return None  # the body took it with a signal wait: handled, and nothing to answer
        if answer.run_status in TERMINAL:
            raise RunFinished(
                f"run {run_id!r} finished ({answer.run_status}) without replying to update {name!r} "
                f"({update_id})",
                details={"status": answer.run_status, "update_id": update_id},
            )
        return NOT_YET

    def late(harness: bool) -> WaitTimeout:
        where = (
            "a wait took it, no ctx.reply yet"
            if seen["taken"]
            else "no ctx.wait_for_update or ctx.wait_for_message took it yet"
        )
        return _late(
            f"update {name!r} ({update_id}) of run {run_id!r} has no reply ({where}); the run is "
            f"{seen['status']}",
            wait,
            harness,
            {"status": seen["status"], "update_id": update_id},
        )

    return Awaited(look, limit, late)


def query(run_id: str, name: str | None = None, *, timeout: Any = None) -> Any:
    """Return the latest value the run exposed with ``ctx.expose(name, value)``, or all of them
    as a dict when ``name`` is None; None if it exposed nothing under ``name``.

    With ``timeout``, wait until the value is set (for ``name`` None, until anything is);
    WaitTimeout past it, RunFinished if the run ended without setting it. Finished runs answer
    too; a run that continued as new answers with its successor's values.
    """
    return until(query_wait(run_id, name, timeout=timeout))


def query_wait(run_id: str, name: str | None = None, *, timeout: Any = None) -> Awaited:
    """Check ``query``'s arguments; the wait for its answer."""
    from .engine import updates

    run_id_of(run_id)
    if name is not None:
        guards.text(name, "name", max_length=column_length("Checkpoint", "name"), kind="name")
    limit = _seconds(timeout, "timeout")
    seen: dict[str, Any] = {}

    def look() -> Any:
        current, status, values = updates.exposed(run_id)
        seen["run"], seen["status"] = current, status
        if name is None and (values or limit is None):
            return {key: decode(value) for key, value in values.items()}
        if name is not None and (name in values or limit is None):
            return decode(values.get(name))
        if status in TERMINAL:
            raise RunFinished(
                f"run {current!r} finished ({status}) without exposing "
                f"{'anything' if name is None else repr(name)}",
                details={"status": status},
            )
        return NOT_YET

    def late(harness: bool) -> WaitTimeout:
        what = "anything" if name is None else repr(name)
        return _late(
            f"run {seen['run']!r} has not exposed {what}; it is {seen['status']}",
            timeout,
            harness,
            {"status": seen["status"]},
        )

    return Awaited(look, limit, late)


def idempotency_key_of(value: Any) -> str | None:
    """An optional idempotency key, checked like the column that keeps it."""
    if value is None:
        return None
    return guards.text(value, "idempotency_key", max_length=column_length("Signal", "idempotency_key"))


def _seconds(value: Any, field: str) -> float | None:
    try:
        delta = optional_duration(value, what=field)
    except ValueError as exc:
        raise guards.refuse(field, str(exc).removeprefix(f"{field}: ")) from None
    return None if delta is None else delta.total_seconds()


def _outside_transactions(call: str) -> None:
    """Refuse to wait inside a transaction: what is awaited is sent when it commits."""
    from django.db import connections

    from . import dispatch

    if dispatch.transport.may_wait and connections[conf.get().DATABASE].in_atomic_block:
        raise guards.refuse(
            "wait",
            f"cannot be used inside transaction.atomic(): {call} blocks for a reply that only "
            "comes once the update is committed and sent; call it outside the transaction, or "
            "without wait",
        )


def until(awaited: Awaited) -> Any:
    """Look until the value is there, in short polls for up to ``awaited.limit`` seconds."""
    started = time.monotonic()
    pause = FIRST_POLL
    while True:
        found = awaited.look()
        if found is not NOT_YET:
            return found
        give_up_if_late(awaited, started)
        time.sleep(pause)
        pause = next_poll(pause)


def give_up_if_late(awaited: Awaited, started: float) -> None:
    """Raise the wait's WaitTimeout when nothing more may come in time (or nothing runs)."""
    from . import dispatch

    if not dispatch.transport.may_wait:
        raise awaited.late(True)
    if time.monotonic() - started >= (awaited.limit or 0):
        raise awaited.late(False)


def _late(problem: str, limit: Any, harness: bool, details: dict[str, Any]) -> WaitTimeout:
    if harness:
        return WaitTimeout(
            f"{problem}; under durable_env nothing runs while you wait: call "
            "durable_env.run_until_idle() or advance_time() first",
            details=details,
        )
    return WaitTimeout(f"{problem}, after {limit}", details=details)
