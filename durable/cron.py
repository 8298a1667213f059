"""Cron schedules declared in code: ``durable.Schedule`` and the checks of a cron expression."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput

OVERLAPS = ("skip", "allow")


@dataclass(frozen=True)
class Schedule:
    """A cron schedule: ``@durable.workflow(schedule=Schedule("0 3 * * *", timezone="Europe/Paris"))``
    or ``durable.schedule(key, workflow, cron=...)``. Each tick starts one run; with
    ``overlap="skip"`` a tick that finds the previous run unfinished starts nothing."""

    cron: str
    input: Any = None
    timezone: str = "UTC"
    overlap: str = "skip"

    def __post_init__(self) -> None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        from .values import stored

        _check_cron(self.cron)
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
            raise InvalidInput(
                f'timezone must be an IANA name such as "Europe/Paris", got {self.timezone!r}'
            ) from None
        if self.overlap not in OVERLAPS:
            raise InvalidInput(f"overlap must be one of {', '.join(OVERLAPS)}, got {self.overlap!r}")
        # Tagged like any workflow input, so each tick's run receives the types given here.
        what = "the schedule's input"
        object.__setattr__(self, "input", stored(self.input, what=what))


def _check_cron(cron: Any) -> None:
    """A cron expression that has a next time: one that never fires ("0 0 30 2 *") is a mistake."""
    from datetime import datetime

    from croniter import CroniterError, croniter

    if not isinstance(cron, str) or "\x00" in cron or not croniter.is_valid(cron):
        raise InvalidInput(f'cron must be a cron expression such as "*/5 * * * *", got {cron!r}')
    try:
        croniter(cron, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterError:
        raise InvalidInput(
            f"cron {cron!r} never fires: no date matches it (e.g. February 30th); fix the day or month"
        ) from None


def schedule_option(value: Any) -> Schedule | None:
    if value is None or isinstance(value, Schedule):
        return value
    if isinstance(value, str):
        return Schedule(value)
    raise InvalidInput(f"schedule= takes a cron string or a durable.Schedule, got {value!r}")
