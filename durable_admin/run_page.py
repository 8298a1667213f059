"""What the run page shows beyond the run's own fields: its timeline, fans, waits and relatives.

Every query here is bounded by a page size, never by the size of the run: a fan of 10,000 steps
is one aggregate row per status and 50 members at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin.utils import quote
from django.db.models import Count, Q
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from durable import clock, conf, guards
from durable.definitions import registry
from durable.models import AttemptError, Checkpoint, Run, Signal, StreamHead, StreamValue
from durable.statuses import UNFINISHED, CheckpointStatus, FlowState, RunStatus

#: Members of a fan shown per page (``?fan=<seq>&page=N``).
FAN_PAGE = 50
#: A fan this narrow or narrower is drawn member by member in the timeline.
NARROW_FAN = 5
#: Positions of the timeline per page (``?from=<seq>``), fan members apart.
TIMELINE_PAGE = 100
#: Child runs, buffered signals and updates named on the page; the rest are a link away.
RELATIVES_SHOWN = 20
#: Streams of a run shown on its page, and the last values shown of each.
STREAMS_SHOWN, STREAM_VALUES_SHOWN = 10, 20

#: Kinds of position a run waits on while they are pending, and how to say so.
WAITS = {
    "step": "step {name} to finish",
    "sleep": "its timer",
    "signal": "signal {name!r}",
    "any_signal": "any of the signals {name}",
    "update": "update {name!r}",
    "message": "a signal or update of {name}",
    "event": "event {name!r}",
    "child": "child run {name}",
    "entity": "entity operation {name}",
    "compensation": "compensation {name} to finish",
}


def flow_text(row: Checkpoint) -> str | None:
    """What a pending step attempt is doing under its fleet-wide limit, and which limit it is."""
    if row.flow is None or row.status != CheckpointStatus.PENDING:
        return None
    step = registry.steps.get(row.name)
    lane = step.lane if step is not None else None
    of_lane = f" of lane {lane.name!r}" if lane is not None else ""
    if row.flow == FlowState.RATE:
        rate = step.rate_limit if step is not None else None
        until = row.wake_at.isoformat(timespec="seconds") if row.wake_at else "?"
        return f"waiting for a rate token (rate_limit {rate or '?'}{of_lane}) until {until}"
    limit = step.concurrency.limit if step is not None and step.concurrency is not None else "?"
    prefix = f"c:lane:{lane.name}:" if lane is not None else f"c:{row.name}:"
    key = (row.flow_key or "")[len(prefix) :] if (row.flow_key or "").startswith(prefix) else ""
    what = f"concurrency {limit}{of_lane}" + (f", key {key!r}" if key else "")
    if row.flow == FlowState.WAITING:
        return f"waiting for a slot ({what}), place {row.flow_seq} in line"
    return f"holds a slot ({what})"


@dataclass
class Position:
    """One row of the timeline: a checkpoint and what it spent where."""

    row: Checkpoint
    queue_wait: timedelta | None
    run_time: timedelta | None
    child: dict[str, Any] | None = None
    #: The traceback of its last failed attempt, when one was kept (``AttemptError``).
    traceback: str = ""
    #: Its bar on the run's time axis (see ``bar``), set once the page's time span is known.
    axis: dict[str, str] = field(default_factory=dict)
    #: Its run has finished: a position still pending never will be settled, nor waits until.
    run_ended: bool = False
    #: Every position before it is settled: a fork may run on from it.
    forkable: bool = False

    @property
    def error(self) -> dict[str, Any] | None:
        error = self.row.error
        if error is None:
            return None
        return error if isinstance(error, dict) else {"message": str(error)}

    @property
    def flow(self) -> str | None:
        return None if self.run_ended else flow_text(self.row)

    @property
    def waiting(self) -> bool:
        return self.row.status == CheckpointStatus.PENDING and not self.run_ended

    @property
    def abandoned(self) -> bool:
        """Pending when its run finished (a wait the run failed or was cancelled in)."""
        return self.row.status == CheckpointStatus.PENDING and self.run_ended

    def bar(self, origin: datetime, span: timedelta) -> dict[str, str]:
        """Where this position sits on the run's time axis, as CSS percentages: its offset, its
        time waiting in a queue, its time running (at least a sliver, so short steps show)."""
        row = self.row
        began = row.enqueued_at or row.started_at
        seconds = span.total_seconds()
        if seconds <= 0:
            return {}

        def share(delta: timedelta | None) -> float:
            return max(0.0, min(100.0, 100 * (delta.total_seconds() if delta else 0) / seconds))

        if began is None:
            # A wait (signal, timer, event) has no start of its own: a tick where it was settled.
            if row.finished_at is None:
                return {}
            return {"left": f"{min(share(row.finished_at - origin), 99.4):.2f}%", "mark": "0.6%"}

        left = share(began - origin)
        queued = share(self.queue_wait) if row.enqueued_at else 0.0
        ran = share(self.run_time)
        ran = max(ran, 0.4) if row.started_at else 0.0
        queued = min(queued, 100 - left)
        ran = min(ran, max(0.0, 100 - left - queued))
        return {"left": f"{left:.2f}%", "queued": f"{queued:.2f}%", "ran": f"{ran:.2f}%"}


@dataclass
class Fan:
    """A fan-out as one line: its first position, its width and its members' statuses."""

    seq: int
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return sum(self.counts.values())

    @property
    def summary(self) -> str:
        return ", ".join(f"{n} {status}" for status, n in sorted(self.counts.items()))


def fans_of(run: Run, db: str) -> dict[int, Fan]:
    """Every fan of ``run`` with its members counted per status, in one aggregate query."""
    fans: dict[int, Fan] = {}
    rows = (
        Checkpoint.objects.using(db)
        .filter(run=run, fan__isnull=False)
        .values_list("fan", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for seq, status, n in rows:
        fans.setdefault(seq, Fan(seq)).counts[status] = n
    return dict(sorted(fans.items()))


def timeline(run: Run, db: str, fans: dict[int, Fan], start: int) -> tuple[list[Position], int | None]:
    """The positions from ``start`` on, wide fans as their first position only; and where the
    next page starts (None on the last page)."""
    wide = [seq for seq, fan in fans.items() if fan.width > NARROW_FAN]
    rows = (
        Checkpoint.objects.using(db)
        .filter(run=run, seq__gte=start)
        .exclude(Q(fan__in=wide) & ~Q(seq__in=wide))
        .defer("input", "output", "token")
        .order_by("seq")[: TIMELINE_PAGE + 1]
    )
    positions = _positions(run, db, list(rows))
    following = positions[TIMELINE_PAGE].row.seq if len(positions) > TIMELINE_PAGE else None
    return positions[:TIMELINE_PAGE], following


def fan_members(run: Run, db: str, fan: Fan, page: int) -> list[Position]:
    """Page ``page`` (from 1) of the fan's members, in position order."""
    offset = (page - 1) * FAN_PAGE
    rows = (
        Checkpoint.objects.using(db)
        .filter(run=run, fan=fan.seq)
        .defer("input", "output", "token")
        .order_by("seq")[offset : offset + FAN_PAGE]
    )
    return _positions(run, db, list(rows))


def _positions(run: Run, db: str, rows: list[Checkpoint]) -> list[Position]:
    # The child runs started at these positions, in one query for the page.
    child_seqs = [row.seq for row in rows if row.kind == "child"]
    children = {}
    if child_seqs:
        found = Run.objects.using(db).filter(parent=run, parent_seq__in=child_seqs)
        children = {c["parent_seq"]: c for c in found.values("id", "status", "parent_seq")}
    return [
        Position(
            row=row,
            queue_wait=_between(row.enqueued_at, row.started_at),
            run_time=_between(row.started_at, row.finished_at),
            child=children.get(row.seq),
            run_ended=run.status not in UNFINISHED,
        )
        for row in rows
    ]


def _between(start: datetime | None, end: datetime | None) -> timedelta | None:
    return end - start if start is not None and end is not None else None


def waits_of(run: Run, db: str, fans: dict[int, Fan]) -> list[str]:
    """What an unfinished run waits for, in words: its pending positions, a wide fan as one."""
    if run.status not in UNFINISHED:
        return []
    wide = {seq: fan for seq, fan in fans.items() if fan.width > NARROW_FAN}
    pending = (
        Checkpoint.objects.using(db)
        .filter(run=run, status=CheckpointStatus.PENDING)
        .exclude(fan__in=list(wide))
        .only("seq", "kind", "name", "status", "fan", "wake_at", "flow", "flow_key", "flow_seq")
        .order_by("seq")[:RELATIVES_SHOWN]
    )
    waits = []
    for fan in wide.values():
        left = fan.counts.get(CheckpointStatus.PENDING, 0)
        if left:
            waits.append(f"fan at position {fan.seq}: {left} of {fan.width} members still pending")
    for row in pending:
        what = WAITS.get(row.kind, "{kind} {name}").format(name=row.name, kind=row.kind)
        flow = flow_text(row)
        if flow:
            what += f": {flow}"
        elif row.wake_at is not None:
            what += f" (until {row.wake_at.isoformat(timespec='seconds')})"
        waits.append(f"position {row.seq}: {what}")
    if not waits and run.status == RunStatus.PENDING:
        if not run.admitted and run.debounce_key is not None:
            start = run.wake_at.isoformat(timespec="seconds") if run.wake_at else "?"
            waits.append(
                f"its debounce key {run.debounce_key!r} to stay quiet: starts at {start} with the "
                "input shown, unless another call for the key comes first (which replaces it)"
            )
        elif not run.admitted and (run.singleton_key or "").startswith("lane:"):
            waits.append(
                f"a slot of lane {run.singleton_key.split(':')[1]!r} (key {run.singleton_key}, priority "
                f"{run.priority}, place {run.singleton_seq} in start order)"
            )
        elif not run.admitted:
            waits.append(
                f"a slot of its singleton key {run.singleton_key} (place {run.singleton_seq} in line)"
            )
        else:
            waits.append(f"a worker consuming queue {run.queue!r} to take its next turn")
    return waits


def streams_of(run: Run, db: str) -> list[dict[str, Any]]:
    """The run's streams (STREAMS_SHOWN at most), each with its last STREAM_VALUES_SHOWN values:
    two queries whatever their lengths, one when the run has none."""
    heads = list(StreamHead.objects.using(db).filter(run=run).order_by("key")[:STREAMS_SHOWN])
    if not heads:
        return []
    latest = Q()
    for head in heads:
        latest |= Q(key=head.key, position__gte=head.next_position - STREAM_VALUES_SHOWN)
    values: dict[str, list[StreamValue]] = {head.key: [] for head in heads}
    for value in StreamValue.objects.using(db).filter(latest, run=run).order_by("key", "position"):
        values[value.key].append(value)
    return [{"head": head, "values": values[head.key]} for head in heads]


def buffered_signals(run: Run, db: str) -> list[Signal]:
    """Signals and updates sent to the run that no wait has taken yet, oldest first."""
    rows = Signal.objects.using(db).filter(run=run, consumed_seq__isnull=True).order_by("id")
    return list(rows.defer("reply")[:RELATIVES_SHOWN])


def recent_signals(run: Run, db: str) -> list[Signal]:
    """The last signals and updates a wait took, newest first."""
    rows = Signal.objects.using(db).filter(run=run, consumed_seq__isnull=False).order_by("-id")
    return list(rows[:RELATIVES_SHOWN])


@dataclass
class Link:
    label: str
    run_id: str
    status: str = ""

    @property
    def url(self) -> str:
        return reverse("admin:durable_run_change", args=[quote(self.run_id)])


def relatives(run: Run, db: str) -> dict[str, Any]:
    """The runs linked to ``run`` either way: parent and children, the continue-as-new chain, the
    dead-letter and on_error runs it handed over to, or the run it handles."""
    runs = Run.objects.using(db)
    links: list[Link] = []
    if run.parent_id:
        links.append(Link("parent", run.parent_id))
    if run.continued_from_id:
        links.append(Link("continued from", run.continued_from_id))
    if run.forked_from_id:
        links.append(Link(f"forked at position {run.forked_at} from", run.forked_from_id))
    for prefix, label in (
        (guards.DLQ_PREFIX, "dead letter of"),
        (guards.ON_ERROR_PREFIX, "handles failure of"),
    ):
        if run.id.startswith(prefix):
            links.append(Link(label, run.id[len(prefix) :]))
    handlers = [f"{guards.DLQ_PREFIX}{run.id}", f"{guards.ON_ERROR_PREFIX}{run.id}"]
    later = runs.filter(Q(continued_from=run) | Q(id__in=handlers) | Q(forked_from_id=run.id)).values_list(
        "id", "status", "continued_from", "forked_at"
    )
    for run_id, status, continued_from, forked_at in later:
        if continued_from == run.id:
            label = "continued by"
        elif forked_at is not None:
            label = f"fork at position {forked_at}"
        else:
            label = "dead letter run" if run_id.startswith(guards.DLQ_PREFIX) else "on_error run"
        links.append(Link(label, run_id, status))
    children = list(
        runs.filter(parent=run)
        .order_by("created_at", "id")
        .values_list("id", "status")[: RELATIVES_SHOWN + 1]
    )
    more_children = len(children) > RELATIVES_SHOWN
    all_children = reverse("admin:durable_run_changelist") + "?" + urlencode({"parent": run.id})
    return {
        "links": links,
        "children": [Link("child", run_id, status) for run_id, status in children[:RELATIVES_SHOWN]],
        "more_children": more_children,
        "children_url": all_children,
    }


def page_number(request: HttpRequest, name: str, default: int | None) -> int | None:
    """A non-negative integer query parameter; a missing or malformed one gives ``default``."""
    try:
        value = int(request.GET[name])
    except (KeyError, ValueError):
        return default
    return value if value >= 0 else default


def context(request: HttpRequest, run: Run) -> dict[str, Any]:
    """Everything the run page draws below the run's fields."""
    db = conf.get().DATABASE
    fans = fans_of(run, db)
    start = page_number(request, "from", 0) or 0
    positions, following = timeline(run, db, fans, start)
    wide = {seq: fan for seq, fan in fans.items() if fan.width > NARROW_FAN}
    opened = wide.get(page_number(request, "fan", None))  # type: ignore[arg-type]
    members: list[Position] = []
    pages = 0
    page = 1
    if opened is not None:
        pages = -(-opened.width // FAN_PAGE)
        page = min(max(page_number(request, "page", 1) or 1, 1), pages)
        members = fan_members(run, db, opened, page)
    origin = run.created_at
    span = (run.finished_at or clock.now()) - origin
    shown = [*positions, *members]
    for position in shown:
        position.axis = position.bar(origin, span)
    _attach_tracebacks(run, db, shown)
    pending = Checkpoint.objects.using(db).filter(run=run, status=CheckpointStatus.PENDING)
    first_pending = pending.order_by("seq").values_list("seq", flat=True).first()
    for position in shown:
        position.forkable = first_pending is None or position.row.seq <= first_pending
    return {
        "positions": positions,
        "timeline_from": start,
        "timeline_next": following,
        "wide_fans": wide,
        "opened_fan": opened,
        "fan_members": members,
        "fan_page": page,
        "fan_pages": pages,
        "fan_page_size": FAN_PAGE,
        "waits": waits_of(run, db, fans),
        "buffered_signals": buffered_signals(run, db),
        "recent_signals": recent_signals(run, db),
        "streams": streams_of(run, db),
        "relatives": relatives(run, db),
        "run_error": run.error if isinstance(run.error, dict) else None,
        "run_failure": _last_failure(run, db) if run.status == RunStatus.FAILED else None,
    }


def _attach_tracebacks(run: Run, db: str, shown: list[Position]) -> None:
    """Give each failed position on the page the traceback of its last failed attempt, in one
    query for the page (none when no position on it failed)."""
    errored = [p.row.seq for p in shown if p.error is not None]
    if not errored:
        return
    failures = AttemptError.objects.using(db).of(run.pk).filter(seq__in=errored).exclude(traceback="")
    latest = {row.seq: row.traceback for row in failures.only("seq", "traceback")}  # oldest first
    for position in shown:
        position.traceback = latest.get(position.row.seq, "")


def _last_failure(run: Run, db: str) -> AttemptError | None:
    """A failed run's last failed attempt that kept a traceback (its position named with it)."""
    failures = AttemptError.objects.using(db).filter(run_id=run.pk).exclude(traceback="")
    return failures.order_by("-id").only("seq", "name", "traceback").first()


#: Runs named one by one on the delete confirmation page; the rest are counted.
DELETION_SHOWN = 50


def deletion_summary(run_ids: list[str]) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
    """What deleting these runs with their subtrees takes, as the admin's delete page shows it:
    (the runs, as links, the first DELETION_SHOWN; rows per kind; permissions lacking; protected)."""
    db = conf.get().DATABASE
    runs = Run.objects.using(db)
    ids, frontier = list(run_ids), list(run_ids)
    while frontier:  # as durable.delete_run walks the tree, one query per generation
        frontier = list(runs.filter(parent_id__in=frontier).values_list("id", flat=True))
        ids.extend(frontier)
    shown = [
        format_html('Run: <a href="{}">{}</a>', Link("", run_id).url, run_id)
        for run_id in ids[:DELETION_SHOWN]
    ]
    if len(ids) > DELETION_SHOWN:
        shown.append(f"and {len(ids) - DELETION_SHOWN} more runs of the subtrees")
    counts = {
        "runs": len(ids),
        "checkpoints": Checkpoint.objects.using(db).filter(run_id__in=ids).count(),
        "signals and updates": Signal.objects.using(db).filter(run_id__in=ids).count(),
    }
    return shown, counts, set(), []
