"""``manage.py durable``: operate runs from a shell (list, show, start, signal, cancel, retry,
fork, purge), run the sweeps once, and ``replay`` stored histories against the code about to ship."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from .. import console


class Command(BaseCommand):
    help = (
        "Operate durable runs: list, show RUN, start, signal, cancel, retry, fork RUN --at SEQ, purge; sweep (run the "
        "sweeps once); replay (check that stored histories replay on the code installed now); reencode "
        "(rewrite payloads under the current codec and first key)."
    )

    def add_arguments(self, parser: Any) -> None:
        console.add_subcommands(parser, self)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        console.run(action, options, self.stdout, self.style)
