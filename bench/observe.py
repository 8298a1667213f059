"""What observing runs costs, and how long the replay check before a deploy takes.

    python bench/observe.py               # 5 interleaved repetitions; about a minute

1. A run of ten local steps (``bench.local10``), started and turned in this process (as family 3's
   ``in_process``, one at a time), four ways, interleaved: ``off`` (no receiver, no tracer
   provider, no metrics: the default without the optional packages), ``signals`` (a receiver on
   every lifecycle signal), ``traced`` (an OpenTelemetry SDK tracer, spans handed to an exporter
   that drops them) and ``metered`` (durable.metrics into both prometheus-client's view and an
   OpenTelemetry SDK meter provider: bench/metering.py's ``both``).
2. ``manage.py durable replay`` over 1,000 stored histories of that workflow (10 positions each).

Writes bench/results/observe.json and observe.md. Its own database ``durable_observe``
(``BENCH_OBSERVE_DB``); no broker (messages are dropped, the turn runs here).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import secrets
import sys
import time
from dataclasses import replace
from io import StringIO
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import ratio, summary  # noqa: E402

PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
DB = os.environ.get("BENCH_OBSERVE_DB", "durable_observe")
RUNS = 200
REPS = 5
HISTORIES = 1000
OUT = Path(__file__).resolve().parent / "results"


def setup() -> None:
    import psycopg

    # DEBUG off: Django keeps no query log (the project then wants a key of its own).
    os.environ.update(
        DATABASE_URL=f"{PG}/{DB}",
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY") or secrets.token_urlsafe(50),
    )
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            conn.execute(f'CREATE DATABASE "{DB}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import bench.workloads  # noqa: F401


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("TRUNCATE durable_run RESTART IDENTITY CASCADE")


def one_run() -> float:
    import durable
    from durable.engine import turn

    t0 = time.perf_counter()
    run_id = durable.start("bench.local10").id
    if turn.advance(run_id) != "completed":
        raise RuntimeError(f"run {run_id} did not complete in one turn")
    return time.perf_counter() - t0


class Mode:
    """One way of observing: entered around a batch of runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.undo: list[Any] = []

    def __enter__(self) -> Mode:
        from bench import metering
        from durable import signals, tracing

        # Metrics only where asked: the venv has prometheus-client, which would meter every way.
        self.undo.append(metering.apply("both" if self.name == "metered" else "off"))

        if self.name == "signals":
            heard: list[Any] = []

            def receive(sender: Any, **facts: Any) -> None:
                heard.append(facts["run_id"])

            for name in [n for n in vars(signals) if n.startswith(("run_", "step_"))]:
                signal = getattr(signals, name)
                signal.connect(receive, weak=False)
                self.undo.append(functools.partial(signal.disconnect, receive))
        if self.name == "traced":
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

            class Drop(SpanExporter):
                def export(self, spans: Any) -> SpanExportResult:
                    return SpanExportResult.SUCCESS

            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(Drop()))
            saved = tracing._tracer
            tracing._tracer = lambda: provider.get_tracer("durable")  # type: ignore[assignment]
            self.undo.append(lambda: setattr(tracing, "_tracer", saved))
        return self

    def __exit__(self, *exc: Any) -> None:
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


def turn_costs() -> dict[str, Any]:
    from durable import dispatch

    saved = dispatch.install(replace(dispatch.transport, send=lambda message: None))
    samples: dict[str, list[float]] = {"off": [], "signals": [], "traced": [], "metered": []}
    try:
        truncate()
        for _ in range(20):
            one_run()
        for _ in range(REPS):
            for name in samples:
                truncate()
                with Mode(name):
                    batch = [one_run() for _ in range(RUNS)]
                samples[name].append(sorted(batch)[len(batch) // 2])
    finally:
        dispatch.install(saved)
    medians = {name: summary(values, 6) for name, values in samples.items()}
    return {
        "per_run_s": medians,
        "signals_vs_off": ratio(medians["signals"]["median"], medians["off"]["median"]),
        "traced_vs_off": ratio(medians["traced"]["median"], medians["off"]["median"]),
        "metered_vs_off": ratio(medians["metered"]["median"], medians["off"]["median"]),
    }


def replay_check() -> dict[str, Any]:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from durable.models import Checkpoint, Run

    truncate()
    one_run()
    template = Run.objects.get()
    positions = list(Checkpoint.objects.filter(run=template))
    runs, rows = [], []
    for i in range(HISTORIES - 1):
        run = copy.copy(template)
        run.id = f"copy-{i:05d}"
        runs.append(run)
        for position in positions:
            row = copy.copy(position)
            row.pk, row.run_id = None, run.id
            rows.append(row)
    Run.objects.bulk_create(runs)
    Checkpoint.objects.bulk_create(rows, batch_size=1000)
    seconds = []
    for _ in range(REPS):
        out = StringIO()
        t0 = time.perf_counter()
        try:
            call_command("durable", "replay", stdout=out)
        except CommandError as exc:
            raise RuntimeError(f"the unchanged workflow broke: {exc}\n{out.getvalue()}") from None
        seconds.append(time.perf_counter() - t0)
    return {"histories": HISTORIES, "positions_each": len(positions), "seconds": summary(seconds)}


def main() -> None:
    setup()
    results = {"turn": turn_costs(), "replay": replay_check(), "runs_per_rep": RUNS, "reps": REPS}
    OUT.mkdir(exist_ok=True)
    (OUT / "observe.json").write_text(json.dumps(results, indent=2))
    turn, check = results["turn"], results["replay"]
    lines = [
        "| measure | median | vs off |",
        "| --- | --- | --- |",
        *(
            f"| `bench.local10` in process, {name} | {turn['per_run_s'][name]['median'] * 1000:.2f} ms | "
            + ("1.00x" if name == "off" else f"{turn[f'{name}_vs_off']:.2f}x")
            + " |"
            for name in ("off", "signals", "traced", "metered")
        ),
        f"| `manage.py durable replay`, {check['histories']} histories of {check['positions_each']} positions "
        f"| {check['seconds']['median']:.2f} s | |",
    ]
    (OUT / "observe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
