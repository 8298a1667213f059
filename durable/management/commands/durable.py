"""``manage.py durable sweep``: run the repair sweeps once, e.g. from cron where beat is not used."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from durable.engine.sweeps import SWEEPS


class Command(BaseCommand):
    help = "Run durable's sweeps once: wake due timers, recover orphaned runs, start due schedules, apply RETENTION."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["sweep"])

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        self.stdout.write(", ".join(sweep.reports.format(sweep.run()) for sweep in SWEEPS))
