"""``manage.py durable sweep``: run the repair sweeps once, e.g. from cron where beat is not used."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from durable.engine import retention, schedules, sweeps


class Command(BaseCommand):
    help = "Run durable's sweeps once: wake due timers, recover orphaned runs, start due schedules, apply RETENTION."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["sweep"])

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        orphans, timers = sweeps.sweep_orphans(), sweeps.sweep_timers()
        ticks, deleted = schedules.sweep_schedules(), retention.sweep_retention()
        self.stdout.write(
            f"recovered {orphans} orphaned run(s), woke {timers} due run(s), started {ticks} scheduled run(s), "
            f"deleted {deleted} finished run(s)"
        )
