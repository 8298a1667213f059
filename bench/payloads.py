"""What values cost: the converter, a codec at rest and the claim check, on turns run in place.

    .venv-bench/bin/python bench/payloads.py      # under a minute

Each figure is a run of ``bench.payloads.*`` started with ``durable.start()`` and its turn run in
this process (``durable.engine.turn.advance``, as the suite's ``local_in_process`` does), its
steps run in place: the path where the converter's share is largest, with no broker hop to hide
it. Variants are measured in alternation (one run of each, again and again) so that a machine
whose speed drifts weighs on all of them alike, and reported as ratios to the plain variant:
- ten steps passing plain JSON (``plain10``) against the same shape holding a ``Decimal``, an
  aware ``datetime``, a ``UUID`` and a dataclass (``typed10``), and ``plain10`` under the Fernet
  codec (``DURABLE["CODEC"]``);
- one step returning 1 MB of text, with the claim check off and on (``OFFLOAD_BYTES``), when this
  version of durable has one.

Writes bench/results/payloads.json and payloads.md. Uses the database ``durable_payloads`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402
from bench.stats import ratio, summary  # noqa: E402

DB = os.environ.get("BENCH_PAYLOADS_DB", "durable_payloads")
TABLES = ("durable_checkpoint", "durable_run")
FERNET_KEY = "aH0lCqk5M2rtbaE1Yg2bFwzqUvZpsz6gx_6cY6N6VbI="
MEGABYTE = 1_000_000


def log(message: str) -> None:
    print(f"[payloads {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _once(workflow: str, value: Any) -> float:
    import durable
    from durable.engine import turn

    t0 = time.perf_counter()
    run_id = durable.start(workflow, value).id
    outcome = turn.advance(run_id)
    elapsed = time.perf_counter() - t0
    if outcome != "completed":
        raise RuntimeError(f"run {run_id} of {workflow} ended {outcome}")
    return elapsed


def _truncate() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")


def _settings(extra: dict[str, Any]) -> Any:
    from django.conf import settings
    from django.test import override_settings

    return override_settings(DURABLE={**getattr(settings, "DURABLE", {}), **extra})


def _alternate(
    variants: dict[str, Callable[[], float]], rounds: int, per_round: int
) -> dict[str, list[float]]:
    """``per_round`` runs of each variant in turn, ``rounds`` times; the seconds of each run."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, once in variants.items():
            samples[name] += [once() for _ in range(per_round)]
        _truncate()
    return samples


def _variant(workflow: str, value: Any, settings: dict[str, Any] | None = None) -> Callable[[], float]:
    def once() -> float:
        if not settings:
            return _once(workflow, value)
        with _settings(settings):
            return _once(workflow, value)

    return once


def measure(rounds: int, per_round: int) -> dict[str, Any]:
    from bench import payload_workloads as w
    from durable import conf, dispatch

    # Serving the default queue, this process runs the steps in place as a worker of their queue would.
    saved = dispatch.install(
        replace(dispatch.transport, send=lambda message: None, served_queues={conf.get().DEFAULT_QUEUE})
    )
    try:
        ten = {
            "plain10": _variant(w.PLAIN10, w.plain_value()),
            "typed10": _variant(w.TYPED10, w.typed_value()),
            "plain10_fernet": _variant(
                w.PLAIN10, w.plain_value(), {"CODEC": "durable.codecs.Fernet", "CODEC_KEYS": [FERNET_KEY]}
            ),
        }
        for once in ten.values():  # warm: imports, prepared statements, the codec's keys
            once()
        log("ten steps: plain, typed, plain under Fernet")
        samples = _alternate(ten, rounds, per_round)
        big: dict[str, list[float]] = {}
        if hasattr(conf.get(), "OFFLOAD_BYTES"):
            storage = tempfile.mkdtemp(prefix="durable-bench-offload-")
            one_mb = {
                "megabyte_in_row": _variant(w.MEGABYTE1, MEGABYTE, {"OFFLOAD_BYTES": None}),
                "megabyte_offloaded": _variant(w.MEGABYTE1, MEGABYTE, {"OFFLOAD_BYTES": 256 * 1024}),
            }
            with _storage(storage):
                for once in one_mb.values():
                    once()
                log("1 MB step result: in the row, offloaded")
                big = _alternate(one_mb, rounds, max(1, per_round // 2))
        else:
            log("this version has no claim check: the 1 MB table is left out")
    finally:
        dispatch.install(saved)
    return {name: summary(values) for name, values in {**samples, **big}.items()}


def _storage(location: str) -> Any:
    from django.conf import settings
    from django.test import override_settings

    storages = dict(getattr(settings, "STORAGES", {}))
    storages["default"] = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": location},
    }
    return override_settings(STORAGES=storages)


def table(figures: dict[str, Any]) -> str:
    plain = figures["plain10"]["median"]
    rows = [
        "| workflow (turn run in this process, steps in place) | median per run | vs plain |",
        "| --- | --- | --- |",
    ]
    labels = {
        "plain10": "ten steps, plain JSON argument and result",
        "typed10": "ten steps, Decimal + aware datetime + UUID + dataclass",
        "plain10_fernet": "ten steps, plain JSON, Fernet codec at rest",
    }
    for name, label in labels.items():
        f = figures[name]
        rows.append(f"| {label} | {f['median'] * 1000:.2f} ms | {ratio(f['median'], plain)}x |")
    if "megabyte_in_row" in figures:
        in_row = figures["megabyte_in_row"]["median"]
        rows += [
            "",
            "| one step returning 1 MB of text | median per run | vs in the row |",
            "| --- | --- | --- |",
            f"| in the row (`OFFLOAD_BYTES: None`) | {in_row * 1000:.1f} ms | 1.0x |",
            f"| offloaded to the filesystem storage (256 KiB threshold) | "
            f"{figures['megabyte_offloaded']['median'] * 1000:.1f} ms | "
            f"{ratio(figures['megabyte_offloaded']['median'], in_row)}x |",
        ]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10, help="alternations of the variants (default 10)")
    parser.add_argument(
        "--per-round", type=int, default=10, help="runs of each variant per round (default 10)"
    )
    parser.add_argument("--out", type=Path, default=env.RESULTS, help="directory for payloads.json / .md")
    args = parser.parse_args()
    env.DURABLE_DB = env.DBOS_DB = DB
    env.ENV["DATABASE_URL"] = f"{env.PG}/{DB}"
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    env.setup()
    source = env.source_hash(env.snapshot_dir)
    log(f"measuring the sources {source} copied to {env.snapshot_dir}; database {DB}")
    _truncate()
    figures = measure(args.rounds, args.per_round)
    result = {
        "source": source,
        "loadavg": {"start": loadavg_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "rounds": args.rounds,
        "per_round": args.per_round,
        "figures": figures,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "payloads.json").write_text(json.dumps(result, indent=2) + "\n")
    md = f"# Payloads\n\nSources {source}; load average {loadavg_start} at the start.\n\n{table(figures)}\n"
    (args.out / "payloads.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
