"""Why an unfinished run has not moved: what it waits for and, when it cannot progress on its
own, the cause an operator can fix (no worker on its queue, no beat, its workflow unknown to
every worker, a full concurrency limit, a body blocked by non-determinism). Read from the rows and the Presence heartbeats."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .. import clock, conf, routing
from ..models import Checkpoint, Presence, Run
from ..models.flow import in_flight, in_line
from ..statuses import MESSAGE_WAITS, UNFINISHED, CheckpointStatus, FlowState, RunStatus
from . import blocked

#: Pending positions described one by one; a wider fan is summed up.
MAX_POSITIONS = 20
#: Worker rows read (the newest first) to find who serves a queue and who served it last.
MAX_WORKERS = 500
#: A worker silent for this many PRESENCE_INTERVALs counts as gone.
WORKER_SILENT_AFTER = 3
#: The timer sweep counts as stopped when a due wake-up waited this many sweep intervals.
SWEEPS_LATE = 2

SWEEP_TIMERS = "durable.sweep_timers"


@dataclass(frozen=True)
class Reason:
    """One line of a run's diagnosis: ``stuck`` when the run cannot progress until someone acts."""

    code: str
    message: str
    stuck: bool = False


def explain(run: Run, now: datetime | None = None) -> list[Reason]:
    """What the unfinished ``run`` waits for, and why it cannot progress if it cannot."""
    if run.status not in UNFINISHED:
        return []
    settings = conf.get()
    now = now or clock.now()
    db = settings.DATABASE
    pending = list(
        Checkpoint.objects.using(db)
        .filter(run_id=run.id, status=CheckpointStatus.PENDING)
        .order_by("seq")[: MAX_POSITIONS + 1]
    )
    # One query for every worker row (pruned after a day: one per worker process seen since).
    known = list(Presence.objects.using(db).filter(kind=Presence.WORKER).order_by("-last_seen")[:MAX_WORKERS])
    silent_since = now - settings.PRESENCE_INTERVAL * WORKER_SILENT_AFTER
    workers = [w for w in known if w.last_seen >= silent_since]
    reasons = [_turn(run, now)]
    if blocked.is_blocked(run.error):
        # It moves once code that replays its history is deployed, and not before.
        reasons.append(Reason("non_determinism", blocked.describe(run.error), stuck=True))
    reasons += [reason for row in pending[:MAX_POSITIONS] for reason in _position(row, now, db)]
    if len(pending) > MAX_POSITIONS:
        reasons.append(Reason("more", f"... and more pending positions past #{pending[-1].seq}"))
    queues = _queues_needed(run, pending, now)
    unserved = {queue for queue in queues if not _serving(queue, workers)}
    reasons += _missing_workers(unserved, known)
    if run.queue not in unserved:
        reasons += _unregistered(run, workers)
    reasons += _beat_silent(run, pending, now, settings, db, workers)
    return reasons


def _turn(run: Run, now: datetime) -> Reason:
    if run.status == RunStatus.PENDING and run.debounce_key is not None and not run.admitted:
        return Reason(
            "turn",
            f"gathers debounce calls for key {run.debounce_key!r}: starts at {_at(run.wake_at)} "
            "unless another call comes first",
        )
    if run.status == RunStatus.PENDING:
        return Reason("turn", f"waits for a worker of queue {run.queue!r} to run its first turn")
    if run.status == RunStatus.RUNNING and run.locked_until and run.locked_until >= now:
        return Reason("turn", f"a turn is running now ({run.locked_by})")
    if run.wake_at is not None and run.wake_at <= now:
        return Reason("turn", f"due since {_at(run.wake_at)}: waits for its next turn on queue {run.queue!r}")
    when = f"; next look at {_at(run.wake_at)}" if run.wake_at else ""
    return Reason("turn", f"{run.status}{when}")


def _position(row: Checkpoint, now: datetime, db: str) -> list[Reason]:
    what = f"#{row.seq} {row.kind} {row.name!r}"
    if row.kind == "step":
        return [_step(row, what, now, db)]
    if row.kind == "sleep":
        return [Reason("timer", f"{what}: timer until {_at(row.wake_at)}")]
    if row.kind in MESSAGE_WAITS:
        until = f" (until {_at(row.wake_at)})" if row.wake_at else ""
        return [Reason("signal", f"{what}: waits for a signal or update{until}")]
    if row.kind == "child":
        child = (row.input or {}).get("run_id")
        return [Reason("child", f"{what}: waits for child run {child}")]
    if row.kind == "event":
        return [Reason("event", f"{what}: waits for event {row.name!r}")]
    return [Reason("wait", f"{what}: pending")]


def _step(row: Checkpoint, what: str, now: datetime, db: str) -> Reason:
    what = f"{what} attempt {row.attempt}"
    if row.flow == FlowState.WAITING and row.flow_key:
        held = in_flight(db, row.flow_key, now).count()
        ahead = in_line(db, row.flow_key).filter(flow_seq__lt=row.flow_seq or 0).count()
        return Reason(
            "flow_slot",
            f"{what}: waits for a slot of concurrency limit {row.flow_key!r} "
            f"({held} held by other attempts, {ahead} ahead in line)",
            stuck=True,
        )
    if row.flow == FlowState.RATE and row.flow_key:
        return Reason(
            "rate_token",
            f"{what}: waits for a token of rate limit {row.flow_key!r} until {_at(row.wake_at)}",
            stuck=True,
        )
    if row.started_at is not None:
        beat = f", last heartbeat {_at(row.last_heartbeat_at)}" if row.last_heartbeat_at else ""
        holder = f" on {row.held_by}" if row.held_by else ""
        return Reason("running", f"{what}: running since {_at(row.started_at)}{holder}{beat}")
    if row.enqueued_at is not None:
        return Reason(
            "queued", f"{what}: sent to queue {row.queue!r} at {_at(row.enqueued_at)}, not taken yet"
        )
    if row.error and row.wake_at:
        return Reason("backoff", f"{what}: retries at {_at(row.wake_at)} after: {row.error.get('message')}")
    return Reason("step", f"{what}: not sent yet")


def _queues_needed(run: Run, pending: list[Checkpoint], now: datetime) -> set[str]:
    """The queues a worker must consume for this run to move now."""
    queues = set()
    due = run.wake_at is not None and run.wake_at <= now
    if run.status == RunStatus.PENDING or due:
        queues.add(run.queue)
    for row in pending:
        if row.kind == "step" and row.enqueued_at is not None and row.started_at is None and not row.flow:
            queues.add(row.queue or run.queue)
    return queues


def _serving(queue: str, workers: list[Presence]) -> list[Presence]:
    return [w for w in workers if queue in (w.queues or [])]


def _missing_workers(queues: set[str], known: list[Presence]) -> list[Reason]:
    reasons = []
    for queue in sorted(queues):
        last = next((w.last_seen for w in known if queue in (w.queues or [])), None)
        seen = f"last seen {_at(last)}" if last else "none seen lately"
        reasons.append(
            Reason(
                "no_worker",
                f"no worker has consumed queue {queue!r} lately ({seen}): start one with `-Q {queue}` "
                "or add the queue to a running worker's -Q",
                stuck=True,
            )
        )
    return reasons


def _unregistered(run: Run, workers: list[Presence]) -> list[Reason]:
    serving = _serving(run.queue, workers)
    wanted = f"{run.workflow}@{run.version}"
    if not serving or any(wanted in (w.workflows or []) for w in serving):
        return []
    return [
        Reason(
            "not_registered",
            f"no worker of queue {run.queue!r} has workflow {run.workflow!r} version {run.version!r} "
            f"registered ({len(serving)} worker(s) seen): import the module that defines it in the "
            "worker (an app's workflows.py in INSTALLED_APPS) and restart it",
            stuck=True,
        )
    ]


def sweep_queue(settings: conf.Settings) -> str:
    """The queue beat sends durable's sweeps to (its namespace's, if it has one)."""
    return routing.queue_in(settings.DEFAULT_QUEUE, settings.NAMESPACE)


def _beat_silent(
    run: Run,
    pending: list[Checkpoint],
    now: datetime,
    settings: conf.Settings,
    db: str,
    workers: list[Presence],
) -> list[Reason]:
    """A wake-up past due by more than the timer sweep allows, and no timer sweep since it: beat
    is not running, or no worker consumes the queue its sweeps wait on."""
    late = settings.TIMER_SWEEP_INTERVAL * SWEEPS_LATE
    due = [run.wake_at] if run.status == RunStatus.SUSPENDED and run.wake_at else []
    due += [row.wake_at for row in pending if row.kind == "sleep" and row.wake_at]
    overdue = [at for at in due if at < now - max(late, timedelta(seconds=1))]
    if not overdue:
        return []
    swept = _last_sweep(SWEEP_TIMERS, run.namespace, db)
    if swept is not None and swept >= min(overdue):
        return []
    last = f"last timer sweep {_at(swept)}" if swept else "no timer sweep recorded"
    # A beat of the run's namespace sends its sweeps to the namespace's queue, a beat of none
    # (which sweeps every namespace) to the default one.
    queues = {routing.queue_in(settings.DEFAULT_QUEUE, run.namespace or None), settings.DEFAULT_QUEUE}
    if not any(_serving(queue, workers) for queue in queues):
        queue = min(queues, key=len)
        return [
            Reason(
                "no_worker",
                f"due at {_at(min(overdue))} but the timer sweep has not run since ({last}): beat "
                f"sends it to queue {queue!r}, which no worker consumes: start one with `-Q {queue}` "
                "or add the queue to a running worker's -Q",
                stuck=True,
            )
        ]
    return [
        Reason(
            "no_beat",
            f"due at {_at(min(overdue))} but beat has not swept since ({last}): run `celery beat` "
            "(one per deployment), which sends durable's sweeps",
            stuck=True,
        )
    ]


def _last_sweep(task: str, namespace: str | None, db: str) -> datetime | None:
    """The last pass of ``task`` that covered ``namespace``: a beat without NAMESPACE sweeps all."""
    names = [task, f"{task}@{namespace}"] if namespace else [task]
    passes = Presence.objects.using(db).filter(kind=Presence.SWEEP, who__in=names)
    return max(passes.values_list("last_seen", flat=True), default=None)


def _at(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "never"


def describe(run_ids: list[str]) -> str:
    """Each unfinished run of ``run_ids`` as its rows hold it (lease, wake-up, positions, the
    diagnosis) and when each sweep last ran: what a test that timed out waiting on them prints."""
    db = conf.get().DATABASE
    lines = [f"now {clock.now().isoformat()}"]
    for run in Run.objects.using(db).filter(id__in=run_ids).order_by("created_at"):
        if run.finished_at is not None:
            continue
        lines.append(
            f"run {run.id} {run.workflow} {run.status}: wake_at={run.wake_at} locked_by={run.locked_by}"
            f" until {run.locked_until}, recovery_attempts={run.recovery_attempts}, wakes={run.wakes},"
            f" updated_at={run.updated_at}"
        )
        for row in Checkpoint.objects.using(db).filter(run_id=run.id).order_by("seq"):
            lines.append(
                f"  #{row.seq} {row.kind} {row.name} {row.status} attempt {row.attempt}: wake_at={row.wake_at}"
                f" enqueued_at={row.enqueued_at} started_at={row.started_at} held_by={row.held_by}"
                f" until {row.held_until} redispatches={row.redispatches}"
            )
        lines += [f"  {reason.code}: {reason.message}" for reason in explain(run)]
    for row in Presence.objects.using(db).order_by("kind", "who"):
        lines.append(f"{row.kind} {row.who}: last seen {row.last_seen}")
    return "\n".join(lines)
