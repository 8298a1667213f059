"""Write bench/results/latest.json and latest.md from one run's results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _verdict(value: float | None, goal: float, at_most: bool) -> str:
    if value is None:
        return "n/a"
    return "met" if (value <= goal if at_most else value >= goal) else "**missed**"


def _reps(*infos: dict[str, Any] | None) -> str:
    """Repetitions behind a figure, flagged when the time budget cut them short."""
    shown = []
    for info in infos:
        if info:
            text = f"{info['done']}" + (
                f" of {info['planned']} (time budget)" if info["cut_by_budget"] else ""
            )
            shown.append(text)
    return " / ".join(shown)


#: Every step through the broker, against the chain on the Django worker / a plain app's chain.
BROKER_GOAL, BROKER_PLAIN_GOAL = 1.5, 2.0
#: Steps run in place, against a plain Celery app's chain.
IN_PLACE_PLAIN_GOAL = 1.0
PLAIN = "a plain Celery app's chain of 10 (no Django, Redis result backend)"


def _plain_rows(results: dict[str, Any], add: Any) -> None:
    """durable's figures of families 1 and 2 (in place, and through the broker) against the
    second anchor: one at a time, interleaved with durable's runs on the same family's worker; at
    once, measured alone in the same run on a worker of the same shape."""
    p = results["plain"]
    chain_per_s = p["chain_per_s"]["median"]
    one: list[tuple[str, float, float, float]] = []
    at_once: list[tuple[str, float, float]] = []
    if "plain_chain_s" in results.get("latency", {}):
        r = results["latency"]
        chain_s = r["plain_chain_s"]["median"]
        one.append(
            ("10 dispatched steps run in place", r["durable_s"]["median"], chain_s, IN_PLACE_PLAIN_GOAL)
        )
        one.append(
            (
                'the same, steps with timeout="30s"',
                r["durable_timed_s"]["median"],
                chain_s,
                IN_PLACE_PLAIN_GOAL,
            )
        )
    if "throughput" in results:
        r = results["throughput"]
        at_once.append(
            ("dispatched-step runs run in place", r["durable_runs_per_s"]["median"], IN_PLACE_PLAIN_GOAL)
        )
        at_once.append(
            (
                'the same, steps with timeout="30s"',
                r["durable_timed_runs_per_s"]["median"],
                IN_PLACE_PLAIN_GOAL,
            )
        )
    if "broker" in results:
        r = results["broker"]
        if "plain_chain_s" in r:
            chain_s = r["plain_chain_s"]["median"]
            one.append(
                ("10 dispatched steps, EAGER_STEPS off", r["durable_s"]["median"], chain_s, BROKER_PLAIN_GOAL)
            )
        at_once.append(("runs with EAGER_STEPS off", r["durable_runs_per_s"], BROKER_PLAIN_GOAL))
    for label, seconds, chain_s, goal in one:
        value = round(seconds / chain_s, 2)
        add(
            f"1. Sequential latency, {label}, vs {PLAIN}",
            _ms(seconds),
            _ms(chain_s),
            value,
            "x the chain's time",
            f"<= {goal:g}x",
            _verdict(value, goal, True),
            "",
        )
    for label, per_s, goal in at_once:
        value = round(chain_per_s / per_s, 2)
        add(
            f"2. Throughput, {p['n']} {label} vs {p['n']} of {PLAIN} at once",
            f"{per_s} runs/s",
            f"{chain_per_s} chains/s",
            value,
            "x the chains' time",
            f"<= {goal:g}x",
            _verdict(value, goal, True),
            _reps(p["reps"]),
        )


def rows(results: dict[str, Any]) -> list[dict[str, str]]:
    """One row per figure: what, durable's number, the peer's (or goal's), the ratio, the goal."""
    out: list[dict[str, str]] = []

    def add(
        what: str,
        durable: str,
        peer: str,
        ratio: float | None,
        ratio_text: str,
        goal: str,
        verdict: str,
        reps: str = "",
    ) -> None:
        out.append(
            {
                "benchmark": what,
                "durable": durable,
                "peer": peer,
                "ratio": "n/a" if ratio is None else f"{ratio} {ratio_text}",
                "goal": goal,
                "verdict": verdict,
                "reps": reps,
            }
        )

    if "latency" in results:
        r = results["latency"]
        add(
            "1. Sequential latency, 10 dispatched steps vs Celery chain of 10 (worker)",
            _ms(r["durable_s"]["median"]),
            _ms(r["chain_s"]["median"]),
            r["ratio_durable_over_chain"],
            "x the chain's time",
            "<= 1.5x",
            _verdict(r["ratio_durable_over_chain"], 1.5, True),
            _reps(r["reps"]),
        )
        if "durable_timed_s" in r:
            add(
                '1. The same, steps with timeout="30s"',
                _ms(r["durable_timed_s"]["median"]),
                _ms(r["chain_s"]["median"]),
                r["ratio_timed_over_chain"],
                "x the chain's time",
                "<= 1.5x",
                _verdict(r["ratio_timed_over_chain"], 1.5, True),
                _reps(r["reps"]),
            )
    if "throughput" in results:
        r = results["throughput"]
        add(
            f"2. Throughput, {r['n']} dispatched-step runs vs {r['n']} chains started at once (worker)",
            f"{r['durable_runs_per_s']['median']} runs/s",
            f"{r['chain_per_s']['median']} chains/s",
            r["ratio_chain_over_durable"],
            "x the chains' time",
            "<= 1.5x",
            _verdict(r["ratio_chain_over_durable"], 1.5, True),
            _reps(r["reps"]),
        )
        if "durable_timed_runs_per_s" in r:
            add(
                '2. The same, steps with timeout="30s"',
                f"{r['durable_timed_runs_per_s']['median']} runs/s",
                f"{r['chain_per_s']['median']} chains/s",
                r["ratio_chain_over_timed"],
                "x the chains' time",
                "<= 1.5x",
                _verdict(r["ratio_chain_over_timed"], 1.5, True),
                _reps(r["reps"]),
            )
    if "broker" in results:
        r = results["broker"]
        add(
            "1. Sequential latency, 10 dispatched steps vs chain of 10, worker with EAGER_STEPS off "
            "(every step through the broker)",
            _ms(r["durable_s"]["median"]),
            _ms(r["chain_s"]["median"]),
            r["ratio_durable_over_chain"],
            "x the chain's time",
            f"<= {BROKER_GOAL:g}x",
            _verdict(r["ratio_durable_over_chain"], BROKER_GOAL, True),
            _reps(r["reps"]),
        )
        add(
            f"2. Throughput, {r['n']} runs vs {r['n']} chains at once, the same worker (EAGER_STEPS off)",
            f"{r['durable_runs_per_s']} runs/s",
            f"{r['chain_per_s']} chains/s",
            r["ratio_chain_over_durable"],
            "x the chains' time",
            f"<= {BROKER_GOAL:g}x",
            _verdict(r["ratio_chain_over_durable"], BROKER_GOAL, True),
            "1",
        )
    if "plain" in results:
        _plain_rows(results, add)
    if "local" in results:
        r = results["local"]
        peer = r["dbos"]["throughput"]
        peer_text = f"{peer['runs_per_s']['median']} runs/s (DBOS start_workflow, then get_result of each)"
        n = peer["n"]
        labels = (
            ("worker", "throughput", "through the worker (2 processes)"),
            (
                "worker",
                "throughput_results",
                "through the worker, a loop of `durable.start` then `durable.result` of each",
            ),
            ("in_process", "throughput", f"in-process, {r['in_process']['threads']} threads"),
        )
        goal = r["compare"].get("goal_min_ratio", 4.0)
        for key, figure, label in labels:
            if figure not in r[key]:  # a results file from before the figure was measured
                continue
            mine = r[key][figure]
            suffix = "_results" if figure == "throughput_results" else ""
            value = r["compare"][f"{key}{suffix}_over_dbos_throughput"]
            add(
                f"3. Throughput, {n} local-step runs (10 steps each), durable {label} vs DBOS in-process",
                f"{mine['runs_per_s']['median']} runs/s",
                peer_text,
                value,
                "x DBOS",
                f">= {goal:g}x",
                _verdict(value, goal, False),
                _reps(mine["reps"], peer["reps"]),
            )
        for key, label in (("worker", "through the worker"), ("in_process", "in-process")):
            mine = r[key]["sequential_s"]
            dbos = r["dbos"]["sequential_s"]
            add(
                f"3. Sequential latency, one local-step run, durable {label} vs DBOS",
                _ms(mine["median"]),
                _ms(dbos["median"]),
                round(mine["median"] / dbos["median"], 2),
                "x DBOS's time",
                "(no goal)",
                "",
                f"{mine['n']} / {dbos['n']}",
            )
    if "sweeps" in results:
        for name, goal in (("timers", 10.0), ("orphans", 20.0)):
            reps = _reps(results["sweeps"]["reps"])
            r = results["sweeps"][name]
            projected = r["projected_10k_s"]
            count_note = "" if r["count"] == 10_000 else f" (measured on {r['count']:,}, scaled)"
            add(
                f"4. Sweep: 10,000 {'due timers woken' if name == 'timers' else 'orphaned runs recovered'}{count_note}",
                f"{projected} s ({r['runs_per_s']} runs/s)",
                f"goal {goal:g} s",
                round(projected / goal, 2),
                "x the goal's time",
                f"<= {goal:g} s",
                _verdict(projected, goal, True),
                reps,
            )
    if "ceiling" in results:
        r = results["ceiling"]
        for label in r.get("fractions", {}).values():  # only when the local family ran too
            add(
                f"5. Local steps/s as a fraction of the commit ceiling: {label['what']}",
                f"{label['steps_per_s']} steps/s",
                f"{label.get('ceiling', r['commits_per_s']['median'])} commits/s",
                label["fraction"],
                "of the ceiling",
                ">= 0.40",
                _verdict(label["fraction"], 0.40, False),
                str(r["commits_per_s"]["n"]),
            )
    if "rss" in results:
        r = results["rss"]
        (a, pa), (b, pb) = list(r["after_runs"].items())
        reps = _reps(r["batches"])
        add(
            f"6. Worker peak RSS (parent + {len(pa['peak_children_mib'])} pool children), after {int(a):,} vs {int(b):,} runs",
            f"{pb['peak_total_mib']} MiB after {int(b):,}",
            f"{pa['peak_total_mib']} MiB after {int(a):,}",
            r["ratio_peak_total"],
            "x",
            "<= 1.10x",
            _verdict(r["ratio_peak_total"], 1.10, True),
            reps,
        )
        add(
            "6. Worker peak RSS, largest pool child",
            f"{pb['peak_max_child_mib']} MiB after {int(b):,}",
            f"{pa['peak_max_child_mib']} MiB after {int(a):,}",
            r["ratio_peak_max_child"],
            "x",
            "<= 1.10x",
            _verdict(r["ratio_peak_max_child"], 1.10, True),
            reps,
        )
    return out


def _table(data: dict[str, Any]) -> list[str]:
    lines = [
        "| Benchmark | durable | peer / goal | ratio | goal | verdict | repetitions |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in data["summary"]:
        lines.append(
            f"| {row['benchmark']} | {row['durable']} | {row['peer']} | {row['ratio']} | {row['goal']} "
            f"| {row['verdict']} | {row['reps']} |"
        )
    return lines


def machine_line(meta: dict[str, Any]) -> str:
    m = meta["machine"]
    return (
        f"{m['date']} · {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM · Python {m['python']} · "
        f"PostgreSQL {m['postgresql']} (synchronous_commit={m['postgresql_synchronous_commit']}) · "
        f"Redis {m['redis']} · {m['worker']} · settings `{meta['settings']}`"
    )


def sources_line(meta: dict[str, Any]) -> str:
    """What was measured and how busy the machine was; the caller adds its total time."""
    return (
        f"Sources measured: durable/ durable_admin/ project/ hash `{meta['source_hash']}`"
        + (
            " (**the work tree differed from this copy when the run ended**: the copy was measured)"
            if meta.get("tree_changed_during_run")
            else ""
        )
        + f". Load average at start / end: {meta['loadavg_start']} / {meta['loadavg_end']}. "
    )


def markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        f"# durable benchmarks ({meta['mode']} run)",
        "",
        machine_line(meta),
        "",
        sources_line(meta) + f"Suite time: {meta['total_s']:.0f} s.",
        "",
        "Each figure is the median of its repetitions (all samples are in latest.json); every ratio "
        "compares two figures measured in this run. Repetitions: durable's / the peer's where they "
        'differ; "time budget" marks a figure that got fewer than planned because the suite keeps '
        "to its time budget and the engine was too slow for all of them.",
        "",
        *_table(data),
    ]
    if "ceiling" in data["results"]:
        r = data["results"]["ceiling"]
        lines += [
            "",
            f"Commit ceiling (psycopg, one connection, INSERT + COMMIT): "
            f"{r['commits_per_s']['median']} commits/s at the start"
            + (
                f", {r['next_to_local']['commits_per_s']['median']} commits/s next to the local families "
                "(family 5 compares with this one)"
                if "next_to_local" in r
                else ""
            )
            + ".",
        ]
    worker = meta.get("worker_peak_rss")
    if worker:
        lines += [
            "",
            f"Peak RSS of the suite's worker (families 1-3): {worker['peak_total_mib']} MiB in all "
            f"(parent {worker['peak_parent_mib']} MiB, children {worker['peak_children_mib']} MiB).",
        ]
    lines += ["", "Packages: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v), ""]
    params = meta["params"]
    lines += [
        f"Parameters: N={params['n']}, up to {params['reps']} repetitions of each throughput figure, "
        f"{params['latency_reps']} single runs for each latency figure, sweeps on {params['sweep_count']:,} rows "
        f"x {params['reps']}, in-process concurrency {params['threads']} threads, RSS after "
        f"{params['rss_first']:,} and {params['rss_last']:,} runs, time budget "
        f"{params['budget_s'] or 'none'} s. Seconds per family: {meta['family_seconds']}; "
        f"1-minute load average as each ended: {meta.get('family_loadavg_1m')}.",
        "",
    ]
    return "\n".join(lines)


# The page of the documentation that holds the generated tables, between <!-- bench:NAME --> markers.
TABLES = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def suite_block(data: dict[str, Any]) -> str:
    """docs/benchmarks.md's copy of a full run: when, where, and the table."""
    meta, m = data["meta"], data["meta"]["machine"]
    lines = [
        f"Suite run {m['date']} · {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM · Python {m['python']} · "
        f"PostgreSQL {m['postgresql']} · Redis {m['redis']} · {m['worker']} · sources `{meta['source_hash']}` · "
        f"{meta['total_s']:.0f} s · load average at start {meta['loadavg_start']}.",
        "",
        *_table(data),
    ]
    return "\n".join(lines)


def update_tables(name: str, text: str, page: Path = TABLES) -> bool:
    """Replace what lies between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    content = page.read_text()
    i, j = content.find(begin), content.find(end)
    if i < 0 or j < i:
        return False
    page.write_text(content[: i + len(begin)] + "\n" + text.strip() + "\n" + content[j:])
    return True


def write(data: dict[str, Any], directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    data["summary"] = rows(data["results"])
    json_path, md_path = directory / "latest.json", directory / "latest.md"
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    md_path.write_text(markdown(data))
    return json_path, md_path
