"""When a running step attempt overruns its limits, and how that is said: one reckoning for the
sync attempts the engine stops by signal (``engine.timelimits``) and the async ones their loop
cancels (``asyncsteps``). Times are seconds on one monotonic clock."""

from __future__ import annotations


def soft_limit(
    began: float, timeout: float | None, last_beat: float, heartbeat_timeout: float | None
) -> float | None:
    """When the attempt overruns: its timeout from ``began``, or its heartbeat_timeout from the
    last beat, whichever comes first; None when it has neither."""
    limits = []
    if timeout is not None:
        limits.append(began + timeout)
    if heartbeat_timeout is not None:
        limits.append(last_beat + heartbeat_timeout)
    return min(limits, default=None)


def overrun(
    what: str, began: float, timeout: float | None, last_beat: float, heartbeat_timeout: float | None
) -> str:
    """Why ``what`` was stopped at its soft limit: it went silent, or it ran past its timeout."""
    silent = heartbeat_timeout is not None and (
        timeout is None or last_beat + heartbeat_timeout < began + timeout
    )
    if silent:
        return f"{what} gave no heartbeat within its heartbeat_timeout of {heartbeat_timeout:g}s"
    return f"{what} ran past its timeout of {timeout:g}s"
