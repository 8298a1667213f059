"""``ctx.logger``: the workflow's log records, silent while the body replays positions it has
already run (a replayed body would otherwise log the same lines on every turn), and held back in
a turn replayed ahead of its write (``TurnState.logs``)."""

from __future__ import annotations

import logging
import sys
from typing import Any


class QuietWhileReplaying(logging.LoggerAdapter):  # type: ignore[type-arg]
    def __init__(self, logger: logging.Logger, ctx: Any) -> None:  # ctx: the replay Context
        super().__init__(logger, {})
        self._ctx = ctx

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        return not self._ctx.is_replaying and self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        ctx = self._ctx
        extra = {
            "run_id": ctx.run_id,
            "workflow": ctx.workflow_name,
            "seq": ctx._here,
            **(kwargs.get("extra") or {}),
        }
        return msg, {**kwargs, "extra": extra}

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        held = self._ctx._turn.logs
        if held is None or not self.isEnabledFor(level):
            super().log(level, msg, *args, **kwargs)
            return
        msg, kwargs = self.process(msg, kwargs)
        exc_info = kwargs.get("exc_info")
        if exc_info and not isinstance(exc_info, tuple):
            exc_info = (
                (type(exc_info), exc_info, exc_info.__traceback__)
                if isinstance(exc_info, BaseException)
                else sys.exc_info()
            )
        # The body's line, as logging would find it: past this frame and the adapter's method.
        where = self.logger.findCaller(kwargs.get("stack_info", False), kwargs.get("stacklevel", 1) + 1)
        held.append(
            self.logger.makeRecord(
                self.logger.name,
                level,
                where[0],
                where[1],
                msg,
                args,
                exc_info,
                where[2],
                kwargs.get("extra"),
                where[3],
            )
        )
