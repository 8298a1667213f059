"""``ctx.logger``: the workflow's log records, silent while the body replays positions it has
already run (a replayed body would otherwise log the same lines on every turn)."""

from __future__ import annotations

import logging
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
