"""The subcommands of ``manage.py durable``: each one parses its arguments, calls the public API
(or the engine's read-only history check) once, and prints what happened."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import CommandError

import durable

from .. import clock, conf, reads, values, wording
from ..durations import parse_duration
from ..engine import blocked, histories, redispatch, retention, sweeps
from ..engine import reencode as reencoding
from ..errors import DurableError, InvalidInput
from ..models import Run
from ..statuses import TERMINAL, RunStatus


def add_subcommands(parser: Any, command: Any) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = sub.add_parser("list", help="the newest runs, filtered")
    listing.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in RunStatus],
        help="only runs with this status (repeatable)",
    )
    listing.add_argument("--workflow", help="only runs of this workflow name")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")

    show = sub.add_parser("show", help="one run and its history")
    show.add_argument("run_id")
    show.add_argument(
        "--json", action="store_true", help="the history as JSON, for durable.testing.replay_history"
    )

    start = sub.add_parser("start", help="start a run, print its id")
    start.add_argument("workflow", help="the workflow's name")
    start.add_argument("input", nargs="?", default="null", help="the input as JSON (default null)")
    start.add_argument("--run-id")
    start.add_argument("--version")
    start.add_argument("--namespace")

    signal = sub.add_parser("signal", help="send a signal to a run")
    signal.add_argument("run_id")
    signal.add_argument("name")
    signal.add_argument("payload", nargs="?", default="null", help="the payload as JSON (default null)")
    signal.add_argument("--idempotency-key")

    cancel = sub.add_parser("cancel", help="cancel an unfinished run")
    cancel.add_argument("run_id")
    cancel.add_argument("--compensate", action="store_true", help="run the compensations first")
    cancel.add_argument("--reason")

    retry = sub.add_parser("retry", help="run a failed, dead or cancelled run again")
    retry.add_argument("run_id")

    fork = sub.add_parser(
        "fork", help="start a new run of RUN's workflow and input, its history before --at copied from RUN"
    )
    fork.add_argument("run_id")
    fork.add_argument("--at", type=int, required=True, help="the position it runs on from")
    fork.add_argument("--run-id", dest="new_run_id", help="the fork's own id")
    fork.add_argument("--version", help="the workflow version to run it on (default RUN's)")

    resend = sub.add_parser(
        "redispatch",
        help="send again the step attempts of runs that were sent and never taken (a fresh "
        "STEP_REDISPATCH_LIMIT), e.g. once a worker for their queue runs",
    )
    resend.add_argument("run_ids", nargs="+", metavar="RUN")

    sub.add_parser("sweep", help="run the sweeps once (from cron where beat is not used)")

    purge = sub.add_parser("purge", help="delete finished run trees older than a duration")
    purge.add_argument("--older-than", required=True, help='finished longer ago than this ("30d", "12h")')
    purge.add_argument(
        "--status", action="append", choices=[s.value for s in TERMINAL], help="only this status (repeatable)"
    )
    purge.add_argument("--workflow", action="append", help="only this workflow (repeatable)")
    purge.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    reencode = sub.add_parser(
        "reencode",
        help="rewrite stored payloads under the current CODEC and first of CODEC_KEYS (after a "
        "key rotation, or once a codec is turned on)",
    )
    reencode.add_argument("--dry-run", action="store_true", help="count the rows to rewrite, write nothing")
    reencode.add_argument("--batch", type=int, default=reencoding.BATCH, help="rows per transaction")

    replay = sub.add_parser(
        "replay", help="replay stored histories on the code installed now; exit 1 if any would break"
    )
    replay.add_argument("--workflow", help="only runs of this workflow name")
    replay.add_argument(
        "--since", help='only runs created since then: an ISO date/time or a duration ago ("7d")'
    )
    replay.add_argument("--run", action="append", dest="runs", help="only this run (repeatable)")
    replay.add_argument(
        "--all", action="store_true", help="list every run replayed, not only those that break"
    )


def run(action: str, options: dict[str, Any], out: Any, style: Any) -> None:
    handlers: dict[str, Callable[[dict[str, Any], Any, Any], None]] = {
        "list": _list,
        "show": _show,
        "start": _start,
        "signal": _signal,
        "cancel": _cancel,
        "retry": _retry,
        "fork": _fork,
        "redispatch": _redispatch,
        "sweep": _sweep,
        "purge": _purge,
        "replay": _replay,
        "reencode": _reencode,
    }
    try:
        handlers[action](options, out, style)
    except DurableError as exc:
        raise CommandError(str(exc)) from None


def _json_arg(text: str, what: str) -> Any:
    try:
        return values.parse_json(text, what)
    except InvalidInput as exc:
        hint = "; quote it, e.g. '{\"order\": 1}'" if "is not JSON" in str(exc) else ""
        raise CommandError(f"{exc}{hint}") from None


def _when(run: Run, field: str) -> str:
    value = getattr(run, field)
    return value.isoformat(timespec="seconds") if value else "-"


def _list(options: dict[str, Any], out: Any, style: Any) -> None:
    runs = Run.objects.using(reads.database()).order_by("-created_at", "-id")  # a replica, if read
    if options["status"]:
        runs = runs.filter(status__in=options["status"])
    if options["workflow"]:
        runs = runs.filter(workflow=options["workflow"])
    rows = runs.only("id", "workflow", "version", "status", "created_at", "updated_at")[
        : max(options["limit"], 0)
    ]
    out.write(f"{'RUN':<34} {'WORKFLOW':<40} {'STATUS':<10} {'CREATED':<26} UPDATED")
    for run in rows:
        out.write(
            f"{run.id:<34} {run.workflow + '@' + run.version:<40} {run.status:<10} "
            f"{_when(run, 'created_at'):<26} {_when(run, 'updated_at')}"
        )


def _show(options: dict[str, Any], out: Any, style: Any) -> None:
    run = durable.get_run(options["run_id"])
    exported = histories.export(run)
    if options["json"]:
        exported["run"].update(output=run.output, error=run.error)
        out.write(json.dumps(exported, indent=2, sort_keys=True))
        return
    out.write(f"run       {run.id}")
    out.write(f"workflow  {run.workflow}@{run.version}  namespace {run.namespace or '-'}")
    out.write(f"status    {run.status}")
    out.write(f"created   {_when(run, 'created_at')}  started {_when(run, 'started_at')}")
    out.write(f"finished  {_when(run, 'finished_at')}  wakes at {_when(run, 'wake_at')}")
    out.write(f"input     {json.dumps(run.input)}")
    if run.output is not None:
        out.write(f"output    {json.dumps(run.output)}")
    if run.error:
        out.write(
            style.ERROR(
                f"error     {run.error.get('type')} [{run.error.get('code')}]: {run.error.get('message')}"
            )
        )
    out.write(f"{'SEQ':>5} {'KIND':<12} {'NAME':<40} {'STATUS':<10} ATTEMPT")
    for position in exported["positions"]:
        out.write(
            f"{position['seq']:>5} {position['kind']:<12} {position['name']:<40} "
            f"{position['status']:<10} {position['attempt']}"
        )


def _start(options: dict[str, Any], out: Any, style: Any) -> None:
    handle = durable.start(
        options["workflow"],
        _json_arg(options["input"], "the input"),
        run_id=options["run_id"],
        version=options["version"],
        namespace=options["namespace"],
    )
    out.write(handle.id)


def _signal(options: dict[str, Any], out: Any, style: Any) -> None:
    payload = _json_arg(options["payload"], "the payload")
    durable.signal(options["run_id"], options["name"], payload, idempotency_key=options["idempotency_key"])
    out.write(f"signal {options['name']!r} sent to run {options['run_id']}")


def _cancel(options: dict[str, Any], out: Any, style: Any) -> None:
    done = durable.cancel(options["run_id"], compensate=options["compensate"], reason=options["reason"])
    out.write(
        f"run {options['run_id']} " + ("cancelled" if done else "had already finished; nothing changed")
    )


def _retry(options: dict[str, Any], out: Any, style: Any) -> None:
    durable.retry(options["run_id"])
    out.write(f"run {options['run_id']} retried")


def _fork(options: dict[str, Any], out: Any, style: Any) -> None:
    forked = durable.fork(
        options["run_id"], at=options["at"], run_id=options["new_run_id"], version=options["version"]
    )
    out.write(forked.id)


def _redispatch(options: dict[str, Any], out: Any, style: Any) -> None:
    sent = redispatch.redispatch(options["run_ids"])
    out.write(f"{wording.counted(sent, 'step attempt')} sent again")


def _sweep(options: dict[str, Any], out: Any, style: Any) -> None:
    # Noted as beat's passes are: the orphan sweep judges lapsed holds by the last one.
    out.write(", ".join(sweep.report(sweeps.run_noted(sweep.task)) for sweep in sweeps.SWEEPS))


def _purge(options: dict[str, Any], out: Any, style: Any) -> None:
    age = _duration(options["older_than"], "--older-than")
    policy = conf.RetentionPolicy(
        statuses=tuple(options["status"] or TERMINAL), max_age=age, workflows=tuple(options["workflow"] or ())
    )
    if options["dry_run"]:
        count = len(retention.expired(policy, clock.now(), 1_000_000))
        out.write(f"{wording.counted(count, 'finished run tree')} would be deleted (dry run)")
        return
    deleted = 0
    while True:
        batch = retention.expired(policy, clock.now(), retention.BATCH)
        gone = retention.delete_trees(batch)
        deleted += gone
        if len(batch) < retention.BATCH or not gone:
            break
    out.write(f"deleted {wording.counted(deleted, 'run')}, children included")


def _reencode(options: dict[str, Any], out: Any, style: Any) -> None:
    dry_run = options["dry_run"]
    verb = "would rewrite" if dry_run else "rewrote"
    if options["batch"] < 1:
        raise CommandError("--batch must be at least 1")

    def report(counts: reencoding.Counts) -> None:
        out.write(f"{counts.table}: {wording.counted(counts.read, 'row')} read, {verb} {counts.rewritten}")

    found = reencoding.reencode(dry_run=dry_run, batch=options["batch"], report=report)
    total = sum(counts.rewritten for counts in found)
    out.write(style.SUCCESS(f"{verb} {wording.counted(total, 'row')}{' (dry run)' if dry_run else ''}"))


def _duration(text: str, what: str) -> Any:
    try:
        return parse_duration(text, what=what)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def _since(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        try:
            return clock.now() - parse_duration(text, what="--since")
        except ValueError:
            raise CommandError(
                f"--since takes an ISO date or time (2026-12-01, 2026-12-01T09:00) or a duration "
                f'ago ("7d", "12h"); got {text!r}'
            ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _replay(options: dict[str, Any], out: Any, style: Any) -> None:
    selection = {
        "workflow": options["workflow"],
        "since": _since(options["since"]),
        "run_ids": options["runs"],
    }
    parked = blocked.parked_among(histories.selected(**selection))
    replayed = broken = resumes = 0
    for verdict in histories.check_stored(**selection):
        replayed += 1
        where = f"{verdict.run_id} {verdict.workflow}@{verdict.version} ({wording.counted(verdict.positions, 'position')})"
        if verdict.ok:
            if verdict.run_id in parked:
                resumes += 1
                out.write(
                    style.SUCCESS(
                        f"RESUMES {where}: blocked by non-determinism now, and this code replays it: "
                        "deploy it and the run resumes by itself"
                    )
                )
            elif options["all"]:
                out.write(f"ok     {where}")
            continue
        broken += 1
        if verdict.run_id in parked:
            out.write(style.ERROR(f"BLOCKED {where}: {blocked.describe(parked[verdict.run_id])}"))
            continue
        kind = type(verdict.error).__name__
        out.write(style.ERROR(f"BREAKS {where}: {kind}: {verdict.error}"))
    summary = (
        f"replayed {wording.counted(replayed, 'stored history', 'stored histories')}: {broken} would break"
    )
    if parked:
        summary += f"; {len(parked)} blocked by non-determinism now, {resumes} of them replay on this code"
    if broken:
        raise CommandError(summary, returncode=1)
    out.write(style.SUCCESS(summary))
