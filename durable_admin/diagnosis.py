"""What a run waits for and why it is stuck, its attempt history with tracebacks, and the health
page (queues, workers, sweeps, due timers), for the admin."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import OperationalError, connections, transaction
from django.db.models import Min
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from durable import clock, conf, routing
from durable.engine import blocked
from durable.engine.diagnosis import WORKER_SILENT_AFTER, sweep_queue
from durable.engine.sweeps import SWEEPS
from durable.models import AttemptError, Checkpoint, Presence, Run
from durable.statuses import CheckpointStatus, RunStatus

from .lanes import lane_figures
from .run_list import COUNT_LIMIT

log = logging.getLogger("durable.admin")

#: Attempt errors shown on a run's page (newest positions' last ones).
MAX_ATTEMPT_ERRORS = 50
#: Runs parked by non-determinism the health page lists (it counts the rest).
MAX_BLOCKED_SHOWN = 20
#: Seconds the health page waits for the broker and for workers to answer a ping.
BROKER_TIMEOUT = 1.0


@admin.display(description="failed attempts")
def attempt_errors(model_admin: Any, obj: Run) -> str:
    rows = list(
        AttemptError.objects.using(conf.get().DATABASE).of(obj.pk).order_by("-id")[:MAX_ATTEMPT_ERRORS]
    )
    if not rows:
        return "-"
    rows.reverse()
    rounds = _rounds(rows)
    return format_html(
        "<table><tr><th>position</th><th>round</th><th>attempt</th><th>failed at</th><th>error</th></tr>"
        "{}</table>",
        format_html_join(
            "",
            "<tr><td>#{} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td></tr>",
            (
                (
                    row.seq,
                    row.name,
                    round_,
                    row.attempt,
                    row.failed_at.strftime("%Y-%m-%d %H:%M:%S"),
                    f"{(row.error or {}).get('type')}: {(row.error or {}).get('message')}",
                    format_html("<details><summary>traceback</summary><pre>{}</pre></details>", row.traceback)
                    if row.traceback
                    else "",
                )
                for row, round_ in zip(rows, rounds, strict=True)
            ),
        ),
    )


def _rounds(rows: list[AttemptError]) -> list[str]:
    """Each failed attempt's round, oldest first: a retry of the run starts its positions' attempts
    at 1 again (the rows keep the attempt as the step saw it), so an attempt number that does not
    grow at its position marks a retry. "1" is the first round shown, "after retry 1" the next."""
    last: dict[int, int] = {}
    retries = 0
    rounds = []
    for row in rows:
        if row.attempt <= last.get(row.seq, 0):
            retries += 1
            last.clear()  # a retry starts every position's count again
        last[row.seq] = row.attempt
        rounds.append("first" if retries == 0 else f"after retry {retries}")
    return rounds


@admin.register(Presence)
class HealthAdmin(admin.ModelAdmin):
    """The health page: the Presence rows' list is replaced by a summary of the whole system."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Durable health",
            "opts": self.model._meta,
            **health(),
        }
        return TemplateResponse(request, "durable_admin/health.html", context)


def health() -> dict[str, Any]:
    """Everything the health page shows, each part bounded and each broker call time-limited."""
    settings = conf.get()
    db = settings.DATABASE
    now = clock.now()
    silent = settings.PRESENCE_INTERVAL * WORKER_SILENT_AFTER
    rows = Presence.objects.using(db).filter(kind=Presence.WORKER).order_by("-last_seen")[:100]
    workers = [{"row": row, "alive": row.last_seen >= now - silent} for row in rows]
    alive = [w["row"] for w in workers if w["alive"]]
    # One row per sweep and namespace its beat serves ("task" or "task@namespace").
    swept = list(Presence.objects.using(db).filter(kind=Presence.SWEEP).order_by("who")[:500])
    # A late sweep is beat's fault only if a worker would have run what it sent.
    sweeps_to = sweep_queue(settings)
    why_late = (
        "is celery beat running?"
        if any(sweeps_to in (w.queues or []) for w in alive)
        else f"no worker consumes queue {sweeps_to!r}, where beat sends the sweeps"
    )
    sweeps = []
    for sweep in SWEEPS:
        every = getattr(settings, sweep.interval)
        rows = [p for p in swept if p.who.partition("@")[0] == sweep.task] or [None]
        for row in rows:
            late = row is None or row.last_seen < now - max(every * 3, timedelta(seconds=10))
            sweeps.append(
                {
                    "task": row.who if row else sweep.task,
                    "every": every,
                    "row": row,
                    "late": why_late if late else None,
                }
            )
    runs = Run.objects.using(db).serving(settings.NAMESPACE)
    steps = Checkpoint.objects.using(db).serving(settings.NAMESPACE)
    unsent = steps.filter(
        kind="step", status=CheckpointStatus.PENDING, enqueued_at__isnull=False, started_at__isnull=True
    )
    # No index serves this (one on the step hot path would cost every dispatch): time-boxed.
    oldest = _time_boxed(db, lambda: unsent.aggregate(oldest=Min("enqueued_at"))["oldest"])
    queue_names = sorted(
        {routing.queue_in(settings.DEFAULT_QUEUE, settings.NAMESPACE)}
        | {queue for worker in alive for queue in (worker.queues or [])}
    )
    queues = queue_lengths(queue_names)
    for queue in queues:
        queue["served_by"] = [w.who for w in alive if queue["name"] in (w.queues or [])]
    return {
        "now": now,
        "workers": workers,
        "pings": ping_workers(),
        "queues": queues,
        "sweeps": sweeps,
        "due_timers": runs.filter(status=RunStatus.SUSPENDED, wake_at__lte=now).count(),
        "pending_runs": runs.filter(status=RunStatus.PENDING).count(),
        **blocked_runs(runs),
        "oldest_pending_step": oldest if oldest is not TIMED_OUT else None,
        "oldest_pending_age": (now - oldest) if oldest and oldest is not TIMED_OUT else None,
        "oldest_timed_out": oldest is TIMED_OUT,
        "lanes": lane_figures(db, now),
    }


def blocked_runs(runs: Any) -> dict[str, Any]:
    """The runs parked by non-determinism: how many (COUNT_LIMIT at most) and the first few,
    each with what blocks it."""
    parked = runs.blocked()
    shown = list(parked.order_by("id").only("id", "workflow", "version", "error")[:MAX_BLOCKED_SHOWN])
    return {
        "blocked_count": parked[: COUNT_LIMIT + 1].count() if shown else 0,
        "blocked_limit": COUNT_LIMIT,
        "blocked": [{"run": run, "why": blocked.describe(run.error)} for run in shown],
    }


#: What a time-boxed query answers when it ran out of time.
TIMED_OUT: Any = object()
#: The most one health query may take on PostgreSQL.
QUERY_TIMEOUT_MS = 2000


def _time_boxed(db: str, query: Any) -> Any:
    """``query()``, or TIMED_OUT once it ran QUERY_TIMEOUT_MS (PostgreSQL; elsewhere unbounded)."""
    connection = connections[db]
    if connection.vendor != "postgresql":
        return query()
    try:
        with transaction.atomic(using=db), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {QUERY_TIMEOUT_MS}")
            answer = query()
            # Inside a request's own transaction the savepoint's SET LOCAL would outlive it.
            cursor.execute("SET LOCAL statement_timeout TO DEFAULT")
            return answer
    except OperationalError:
        return TIMED_OUT


def queue_lengths(names: list[str]) -> list[dict[str, Any]]:
    """Each queue's waiting messages, asked of the broker passively (nothing is created); None
    when the broker cannot say (then ``error`` says why)."""
    from celery import current_app

    found = []
    try:
        with current_app.connection_for_read() as connection:
            connection.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT)
            channel = connection.default_channel
            for name in names:
                try:
                    _, messages, consumers = channel.queue_declare(queue=name, passive=True)
                    found.append({"name": name, "messages": messages, "consumers": consumers, "error": ""})
                except Exception as exc:  # noqa: BLE001 - a queue no one declared yet, a broker that cannot tell
                    found.append({"name": name, "messages": None, "consumers": None, "error": str(exc)})
                    channel = connection.channel()  # a failed passive declare may close the channel
    except Exception as exc:  # noqa: BLE001 - the page shows the rest without the broker
        log.warning("durable: could not ask the broker for queue lengths: %s", exc)
        return [{"name": name, "messages": None, "consumers": None, "error": str(exc)} for name in names]
    return found


def ping_workers() -> dict[str, Any]:
    """Celery's own view of the workers (``inspect ping``), within BROKER_TIMEOUT."""
    from celery import current_app

    try:
        replies = current_app.control.ping(timeout=BROKER_TIMEOUT) or []
    except Exception as exc:  # noqa: BLE001 - a broker without broadcast (the filesystem one)
        return {"names": [], "error": f"{type(exc).__name__}: {exc}"}
    return {"names": sorted(name for reply in replies for name in reply), "error": ""}
