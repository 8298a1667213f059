"""Run the example order workflow end to end on real Celery worker and beat processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

import durable
from durable import conf
from durable.models import Checkpoint
from durable.processes import CeleryProcess

ORDER = {
    "id": 1042,
    "items": [{"sku": "mug", "cents": 1250, "qty": 2}, {"sku": "tea", "cents": 800, "qty": 1}],
    "cooling_off": "2s",
}


class Command(BaseCommand):
    help = "Start a worker and beat, run the example order workflow to completion, print each step."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the run")

    def handle(self, *args: Any, timeout: float, **options: Any) -> None:
        call_command("migrate", verbosity=0)
        var = Path(settings.VAR_DIR)
        var.mkdir(parents=True, exist_ok=True)
        celery = [sys.executable, "-m", "celery", "-A", "project"]
        queue = conf.get().DEFAULT_QUEUE
        env = dict(os.environ)
        worker = CeleryProcess(
            [*celery, "worker", "-Q", f"{queue},celery", "-c", "2", "--loglevel=INFO"],
            env,
            var / "demo-worker.log",
            "ready.",
        )
        beat = CeleryProcess(
            [*celery, "beat", "--loglevel=INFO", "-s", str(var / "demo-beat-schedule"), "--pidfile="],
            env,
            var / "demo-beat.log",
            "beat: Starting",
        )
        self.stdout.write("starting a celery worker and celery beat ...")
        worker.start()
        beat.start()
        try:
            self._run(timeout)
            self._wholesale(timeout)
        finally:
            beat.stop()
            worker.stop()

    def _run(self, timeout: float) -> None:
        handle = durable.start("shop.fulfil", ORDER)
        self.stdout.write(f"started run {handle.id} of shop.fulfil")
        shown: dict[int, tuple[str, int]] = {}
        signalled = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for cp in Checkpoint.objects.filter(run_id=handle.id).order_by("seq"):
                if shown.get(cp.seq) != (cp.status, cp.attempt):
                    shown[cp.seq] = (cp.status, cp.attempt)
                    self._show(cp)
                if cp.kind == "signal" and cp.status == "pending" and not signalled:
                    self.stdout.write("  -> a person approves the order: durable.signal(run, 'approve', ...)")
                    durable.signal(handle.id, "approve", {"address": "12 Rue de la Paix, Paris"})
                    signalled = True
            run = durable.get_run(handle.id)
            if run.is_finished:
                break
            time.sleep(0.1)
        try:
            output = durable.result(handle.id, timeout=0)
        except durable.DurableError as exc:
            raise CommandError(f"the run did not complete: {exc}") from exc
        self.stdout.write(self.style.SUCCESS(f"run {handle.id} completed: {output}"))

    def _wholesale(self, timeout: float) -> None:
        handle = durable.start("shop.wholesale", {**ORDER, "id": ORDER["id"] + 1})
        self.stdout.write(f"started run {handle.id} of shop.wholesale (a fan, a child, a saga)")
        output = durable.result(handle.id, timeout=timeout)
        fan = Checkpoint.objects.filter(run_id=handle.id, fan__isnull=False).count()
        self.stdout.write(f"  {fan} fan members recorded; child invoice {output['invoice']}")
        self.stdout.write(self.style.SUCCESS(f"run {handle.id} completed: {output}"))

    def _show(self, cp: Checkpoint) -> None:
        label = f"  [{cp.seq}] {cp.kind} {cp.name}"
        if cp.status == "completed":
            detail = "" if cp.output is None else f" -> {cp.output}"
            self.stdout.write(f"{label}: completed (attempt {cp.attempt}){detail}")
        elif cp.status == "failed":
            self.stdout.write(f"{label}: failed: {(cp.error or {}).get('message')}")
        elif cp.error:
            self.stdout.write(
                f"{label}: attempt {cp.attempt - 1} failed ({cp.error.get('message')}), retrying"
            )
        elif cp.kind == "sleep":
            self.stdout.write(f"{label}: sleeping until {cp.wake_at:%H:%M:%S}")
        elif cp.kind == "signal":
            self.stdout.write(f"{label}: waiting for signal")
