"""The event loop an ``async def`` workflow body runs on: private to one turn, with no clock, no
I/O and no threads, so what the body does between two idle points depends on its history only.

``asyncio.BaseEventLoop`` already queues callbacks first in, first out and runs tasks, futures,
``gather`` and ``TaskGroup`` as any loop does; this one is stepped by ``run_ready`` until nothing
is ready (``asyncbody`` decides what happens at each idle point) instead of by a selector. A timer
(``asyncio.sleep(n)``, ``wait_for``, ``timeout``), an executor, a socket, a pipe or a signal
handler would make the body depend on the wall clock or the outside world, which a replay cannot
repeat: each is refused where the body asks for it, with ``nondeterministic_await``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from asyncio import events
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..errors import DurableError, ErrorCode

#: The code that is not the body's own when naming where it awaited: asyncio and durable.
_LIBRARY = (
    os.path.dirname(asyncio.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


class BodyLoop(asyncio.BaseEventLoop):
    """An event loop that runs ready callbacks only; ``refuse`` stops the turn (see ``asyncbody``)."""

    def __init__(self, refuse: Callable[[DurableError], BaseException]) -> None:
        super().__init__()
        self._refuse = refuse
        #: Every task of the body, so that the end of the turn retrieves what they raised.
        self.tasks: list[asyncio.Task[Any]] = []

    def create_task(self, coro: Any, *args: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = super().create_task(coro, *args, **kwargs)
        self.tasks.append(task)
        return task

    def run_ready(self) -> None:
        """Run callbacks, oldest first, until none is ready (those they schedule included)."""
        outer = events._get_running_loop()
        events._set_running_loop(self)
        self._thread_id = threading.get_ident()
        ready = self._ready  # type: ignore[attr-defined]
        try:
            while ready:
                handle = ready.popleft()
                if not handle._cancelled:
                    handle._run()
        finally:
            self._thread_id = None  # type: ignore[assignment]  # asyncio sets None when a loop stops
            events._set_running_loop(outer)

    def refused(self, what: str) -> BaseException:
        """The error for the body asking for ``what``, noted by the turn so it fails the run even
        when the body catches it."""
        called, where = body_frame(sys._getframe(1))
        message = (
            f"the workflow body awaited {called or what} at {where}, which replay cannot repeat "
            f"({what}): await only durable primitives in a body (await ctx.sleep(...) for a timer, "
            "await ctx.step(...) for I/O)"
        )
        return self._refuse(
            DurableError(
                message,
                code=ErrorCode.NONDETERMINISTIC_AWAIT,
                details={"awaited": called or what, "at": where},
            )
        )


def _refusing(what: str) -> Callable[..., Any]:
    def refuse(self: BodyLoop, *args: Any, **kwargs: Any) -> Any:
        raise self.refused(what)

    return refuse


#: What a body may not ask of its loop, and how the refusal names it.
_REFUSED = {
    "call_at": "a timer of the event loop",
    "call_soon_threadsafe": "a callback from another thread",
    "run_in_executor": "a thread of an executor",
    **{
        name: f"I/O ({name})"
        for name in (
            "getaddrinfo",
            "getnameinfo",
            "create_connection",
            "create_server",
            "create_unix_connection",
            "create_unix_server",
            "create_datagram_endpoint",
            "connect_accepted_socket",
            "sendfile",
            "start_tls",
            "sock_recv",
            "sock_recv_into",
            "sock_recvfrom",
            "sock_recvfrom_into",
            "sock_sendall",
            "sock_sendto",
            "sock_connect",
            "sock_accept",
            "sock_sendfile",
            "add_reader",
            "add_writer",
            "connect_read_pipe",
            "connect_write_pipe",
            "subprocess_exec",
            "subprocess_shell",
            "add_signal_handler",
        )
    },
}
for _name, _what in _REFUSED.items():
    setattr(BodyLoop, _name, _refusing(_what))


def body_frame(frame: FrameType | None) -> tuple[str | None, str]:
    """The call the body made into a library (``asyncio.sleep``...) and the body's ``file:line``,
    from ``frame`` outwards."""
    called = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_LIBRARY):
            return called, f"{filename}:{frame.f_lineno}"
        if filename.startswith(_LIBRARY[0]):
            called = f"asyncio.{_qualname(frame)}()"
        frame = frame.f_back
    return called, "an unknown place"


def task_frame(task: asyncio.Task[Any]) -> tuple[str | None, str]:
    """What ``task`` awaits and where in the body, from the innermost frame of its coroutines."""
    frames = []
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    called, where = None, "an unknown place"
    for frame in frames:
        if frame.f_code.co_filename.startswith(_LIBRARY):
            if called is None and frame.f_code.co_filename.startswith(_LIBRARY[0]):
                called = f"asyncio.{_qualname(frame)}()"
        else:
            called, where = None, f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return called, where


def _qualname(frame: FrameType) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
