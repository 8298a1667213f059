"""Crash-point exploration: kill the "process" at every point a real one could die, then check
the invariants of docs/guarantees.md ("Checked at every crash point").

A scenario runs once fault-free under ``durable_env`` (real commits: ``transactional_db``),
counting its crash points: every SQL statement on the connection (before it runs), every commit
(before and after), every message publish (before and after) and every message receipt. Then,
for each point k in turn, the database is emptied and the scenario runs again; at point k the
process dies:

- ``Killed`` (a BaseException no engine code catches) is raised there, after the open
  transaction is rolled back on the raw connection and its pending on-commit callbacks dropped,
  as a dead connection's would be;
- from then on the process is dead: any statement, commit or publish the unwinding code still
  tries (an engine ``finally`` or ``except BaseException``) raises ``Killed`` again and is
  counted as a post-mortem attempt: a dead process runs no code, so nothing of it takes effect;
- the message it was handling is redelivered (acks_late + reject_on_worker_lost); the messages
  it had published stay;
- the restart forgets the process's memory (leases, holds, sweep passes, its holder name), moves
  the clock past the lease, runs the sweeps and delivers messages until idle, then the scenario's
  remaining actions run and the run is driven to its end.

The client's own calls (``durable.start``, ``durable.signal``) are not crash points here.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import connections, transaction
from django.db.models import F, Q

import durable
from durable import conf
from durable.definitions import registry
from durable.engine import histories
from durable.models import TERMINAL, Checkpoint, Fan, Run
from durable.testing import DurableEnv, crashes, replay_history

#: What happens at the target point: the process dies there, or (receipts only) the message
#: received there is lost, delivered twice, or delivered after every message pending behind it.
KILL, DROP, DOUBLE, REORDER = "kill", "drop", "double", "reorder"


class Killed(BaseException):  # noqa: N818 - it is a death, not an error
    """The process died here. Not a ``_ControlFlow``: nothing in the engine may recognise it."""


#: Step bodies call ``effect()``: (run, seq, attempt) -> how many times the body ran.
EFFECTS: Counter[tuple[str, int, int]] = Counter()


def effect() -> None:
    """A step's side effect, counted outside the database (a crash does not roll it back)."""
    info = durable.step_info()
    EFFECTS[(info.run_id, info.seq, info.attempt)] += 1


@dataclass
class Scenario:
    name: str
    start: Callable[[], str]
    #: What drives the run: each gets the env and the run id. A ``client`` action is not
    #: explored (a caller's call: durable.signal, say).
    actions: list[tuple[str, Callable[[DurableEnv, str], Any]]] = field(default_factory=list)
    #: Set up the env for the scenario (e.g. a worker that runs steps in place).
    prepare: Callable[[DurableEnv], None] = lambda env: None


def deliver(env: DurableEnv, run_id: str) -> None:
    env.run_until_idle()


def advance(duration: str) -> Callable[[DurableEnv, str], None]:
    def act(env: DurableEnv, run_id: str) -> None:
        env.advance_time(duration)

    return act


@dataclass
class Outcome:
    points: list[str]
    status: str
    output: Any
    error_code: str | None
    positions: list[tuple[int, int, str, str]]
    #: What outlives the run: each entity's state and op count, each update's reply.
    kept: list[Any]
    post_mortem: list[str]
    #: The faults that struck, in order ("kill at <point>", "drop at receipt of <message>").
    struck: list[str]

    @property
    def killed_at(self) -> str | None:
        return self.struck[0] if self.struck else None


#: A run's faults in order: each (fault, k) strikes at the k-th point of its kind (every point for
#: a kill, a message receipt for the others) counted from where the fault before it struck.
Schedule = list[tuple[str, int]]


class Explorer:
    def __init__(self, env: DurableEnv, scenario: Scenario) -> None:
        self.env, self.scenario = env, scenario
        self.db = conf.get().DATABASE
        self.connection = connections[self.db]
        self.armed = False
        self.dead = False
        self.schedule: Schedule = []
        self.count = 0
        self.points: list[str] = []
        self.post_mortem: list[str] = []
        self.struck: list[str] = []
        self._install()

    # --- the points ---------------------------------------------------------------------------

    def point(self, what: str, receipt: bool = False) -> str | None:
        """Count a point; at the next fault's, kill the process there (or, for a message fault,
        return it: the receipt applies it). A run without faults counts every point."""
        if self.dead:
            # Code the dead process would never have run: refused, and noted with its caller.
            engine = [f for f in traceback.extract_stack() if "/durable/" in f.filename]
            where = f"{engine[-1].filename.rpartition('/durable/')[2]}:{engine[-1].name}" if engine else "?"
            self.post_mortem.append(f"{what[:60]} from {where}")
            raise Killed(f"post mortem: {what}")
        fault, k = self.schedule[0] if self.schedule else (KILL, 0)
        if not self.armed or (fault != KILL and not receipt):
            return None
        self.count += 1
        self.points.append(what)
        if self.count != k:
            return None
        self.schedule.pop(0)
        self.count = 0
        self.struck.append(f"{fault} at {what}")
        if fault == KILL:
            self.kill(what)
        return fault

    def kill(self, what: str) -> None:
        self.dead, self.armed = True, False
        raw = self.connection.connection
        if raw is not None:
            raw.rollback()  # a dead connection's transaction is rolled back by the server
        self.connection.run_on_commit = []
        raise Killed(what)

    def _install(self) -> None:
        env, connection = self.env, self.connection

        def statement(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            self.point(f"statement {' '.join(sql.split())[:160]}")
            return execute(sql, params, many, context)

        self._wrapper = connection.execute_wrapper(statement)
        self._wrapper.__enter__()
        wrap_commit(connection, self.point)
        capture = env.capture

        def publish(message: Any) -> None:
            self.point(f"before publish {message.task}{message.args}")
            capture(message)
            self.point(f"after publish {message.task}{message.args}")

        env.transport.send = publish
        run_next = env.run_next

        def receive() -> Any:
            if not env.pending():
                return None
            message = env.messages[0]
            fault = self.point(f"receipt of {message.task}{message.args}", receipt=True)
            if fault is not None:
                if fault == DROP:  # lost by the broker before any worker saw it
                    env.messages.pop(0)
                    return message
                if fault == REORDER:  # overtaken by the rest of the queue
                    env.messages.append(env.messages.pop(0))
                    return message
                # DOUBLE: delivered again once handled (a redelivery, a publisher's retry)
                handled = run_next()
                env.messages.insert(0, message)
                return handled
            try:
                return run_next()
            except Killed:
                if message not in env.messages:
                    env.messages.insert(0, message)  # unacknowledged: the broker redelivers it
                raise

        env.run_next = receive  # type: ignore[method-assign]

    def uninstall(self) -> None:
        self._wrapper.__exit__(None, None, None)
        del self.connection.commit

    # --- one run ------------------------------------------------------------------------------

    def forget(self) -> None:
        """A fresh process: nothing of the dead one's memory."""
        crashes.forget()

    def reset(self) -> None:
        # DELETE, not TRUNCATE (slow on PostgreSQL for a few rows), in one transaction: the
        # foreign keys Django makes are checked at its commit.
        quote = self.connection.ops.quote_name
        with transaction.atomic(using=self.db), self.connection.cursor() as cursor:
            for model in apps.get_app_config("durable").get_models():
                cursor.execute(f"DELETE FROM {quote(model._meta.db_table)}")
        self.env.messages.clear()
        EFFECTS.clear()
        self.forget()

    def restart(self) -> None:
        """A new process, at once: what the dead one held lapses as the clock moves on (the
        remaining actions, then ``settle``)."""
        self.dead = False
        self.forget()

    def run(self, schedule: Schedule) -> tuple[str, Outcome]:
        self.reset()
        self.schedule, self.count, self.points, self.post_mortem = list(schedule), 0, [], []
        self.dead, self.struck = False, []
        self.scenario.prepare(self.env)
        run_id = self.scenario.start()
        for kind, action in self.scenario.actions:
            self.armed = kind != "client" and (bool(self.schedule) or not schedule)
            try:
                action(self.env, run_id)
            except Killed:
                self.armed = False
                self.restart()
            finally:
                self.armed = False
            if self.dead:  # something swallowed the death: still a dead process
                self.restart()
        self.settle(run_id)
        return run_id, self.outcome(run_id)

    def settle(self, run_id: str) -> None:
        """Move the clock a lease at a time (sweeps and messages run) until the run's tree has
        ended and nothing of a dead process is left to lapse."""
        past_lease = conf.get().LEASE + timedelta(seconds=1)
        self.env.run_until_idle()
        for _ in range(60):
            runs = self.tree(run_id)
            if (
                not self.env.pending()
                # A run a sweep starts (a schedule's tick) exists once a pass after the restart ran.
                and Run.objects.filter(id=run_id).exists()
                and not Run.objects.filter(id__in=runs).exclude(status__in=TERMINAL).exists()
                and not Run.objects.filter(id__in=runs).exclude(locked_by=None).exists()
                and not Checkpoint.objects.filter(run__in=runs).exclude(held_by=None).exists()
            ):
                return
            # A run waiting for a timer (say, one that began late because of the crash) is
            # woken by it: jump there rather than a lease at a time.
            wakes = Run.objects.filter(id__in=runs).exclude(status__in=TERMINAL).exclude(wake_at=None)
            due = min(wakes.values_list("wake_at", flat=True), default=None)
            now = self.env.now()
            self.env.advance_time(max(past_lease, (due - now + timedelta(seconds=1)) if due else past_lease))

    def outcome(self, run_id: str) -> Outcome:
        run = Run.objects.get(id=run_id)
        # A run that continued as new ends naming its successor, a fresh id each run: the last
        # of the chain says how it ended.
        while (successor := Run.objects.filter(continued_from_id=run.id).first()) is not None:
            run = successor
        # Children get fresh ids each run: a run is named by its place in the tree.
        tree = {tree_id: i for i, tree_id in enumerate(self.tree(run_id))}
        # An async body's ``resumed`` positions record which answers an idle point handed out:
        # when each answer came, which a crash changes (a member sent late answers late), not
        # what the run did. The others are compared in order, numbered without them.
        kept = Checkpoint.objects.filter(run__in=tree).exclude(kind="resumed").order_by("run_id", "seq")
        numbered = Counter[str]()
        positions = []
        for c in kept:
            positions.append((tree[c.run_id], numbered[c.run_id], c.kind, c.name))
            numbered[c.run_id] += 1
        positions.sort()
        from durable.models import Entity, Signal

        kept: list[Any] = [
            (e.name, e.key, e.state, e.applied) for e in Entity.objects.order_by("name", "key")
        ]
        updates = Signal.objects.filter(run__in=tree, is_update=True).order_by("created_at", "id")
        kept += [(tree[s.run_id], s.name, s.reply) for s in updates]
        # What bodies wrote to their streams: once per position, whatever the crash (a step's
        # writes are once per attempt, and a kill may cost an attempt: left out).
        from durable.models import StreamHead, StreamValue

        written = StreamValue.objects.filter(run__in=tree, attempt=0).order_by("run_id", "key", "position")
        kept += [(tree[v.run_id], v.key, v.position, v.value) for v in written]
        kept += [
            (tree[h.run_id], h.key, h.closed)
            for h in StreamHead.objects.filter(run__in=tree).order_by("run_id", "key")
        ]
        return Outcome(
            list(self.points),
            run.status,
            run.output,
            (run.error or {}).get("code"),
            positions,
            kept,
            list(self.post_mortem),
            list(self.struck),
        )

    def tree(self, run_id: str) -> list[str]:
        """The run, its children and its successors (continue-as-new), theirs too."""
        ids, frontier = [run_id], [run_id]
        while frontier:
            next_of = Q(parent_id__in=frontier) | Q(continued_from_id__in=frontier)
            # By position in the parent (ids differ from run to run: they derive from the parent's).
            ordered = Run.objects.filter(next_of).order_by(F("parent_seq").asc(nulls_first=True), "id")
            frontier = list(ordered.values_list("id", flat=True))
            ids += frontier
        return ids

    # --- the invariants -----------------------------------------------------------------------

    def violations(self, run_id: str, baseline: Outcome, got: Outcome) -> list[str]:
        found = []
        if (got.status, got.output, got.error_code) != (
            baseline.status,
            baseline.output,
            baseline.error_code,
        ):
            found.append(
                f"ends {got.status} {got.output!r} {got.error_code!r}, fault-free "
                f"{baseline.status} {baseline.output!r} {baseline.error_code!r}"
            )
        if got.positions != baseline.positions:
            found.append(f"positions {got.positions} differ from the fault-free {baseline.positions}")
        if got.kept != baseline.kept:
            found.append(
                f"entities, replies and streams {got.kept} differ from the fault-free {baseline.kept}"
            )
        runs = self.tree(run_id)
        again = 0
        for c in Checkpoint.objects.filter(run__in=runs, kind="step"):
            problems, extra = step_problems(
                c, {a: n for (r, s, a), n in EFFECTS.items() if (r, s) == (c.run_id, c.seq)}
            )
            found += problems
            again += extra
        for run in Run.objects.filter(id__in=runs):
            found += run_problems(run)
        kills = sum(1 for fault in got.struck if fault.startswith(f"{KILL} at"))
        if again > kills:
            found.append(f"local steps ran {again} extra time(s) for {kills} kill(s)")
        leftovers = Checkpoint.objects.filter(run__in=runs).exclude(held_by=None)
        found += [f"{c}: still held by {c.held_by}" for c in leftovers]
        found += [
            f"{c}: still {c.flow} a flow slot"
            for c in Checkpoint.objects.filter(run__in=runs, flow__in=("held", "waiting"))
        ]
        # A run cancelled outright stops where it stood: its waits stay as they were.
        pending = Checkpoint.objects.filter(run__in=runs, status="pending").exclude(run__status="cancelled")
        found += [f"{c}: still pending" for c in pending]
        for fan in Fan.objects.filter(run__in=runs):
            members = Checkpoint.objects.filter(run_id=fan.run_id, fan=fan.first, status="pending")
            if fan.pending != members.count():
                found.append(f"{fan}: {members.count()} of its members are pending")
        from durable.models import EntityPrompt, FlowGate, Signal

        found += [
            f"signal {s.name} of {s.run_id} never consumed"
            for s in Signal.objects.filter(run__in=runs, consumed_seq=None)
        ]
        found += [f"entity prompt {p} left" for p in EntityPrompt.objects.all()]
        found += [f"flow gate {g} has {g.waiting} waiting" for g in FlowGate.objects.exclude(waiting=0)]
        return found


def step_problems(position: Checkpoint, ran: dict[int, int]) -> tuple[list[str], int]:
    """What breaks the invariants at a step position whose attempts' bodies ran ``ran`` times
    (attempt -> count), and how many extra runs of an attempt it had as a local step (allowed,
    one per death: its attempt is not held, so a death after its body and before its record runs
    it again as the same attempt; docs/guarantees.md, "At least once")."""
    found, again = [], 0
    twice = {a: n for a, n in ran.items() if n > 1}
    if twice and registry.step(position.name).local:
        again = sum(n - 1 for n in twice.values())
    elif twice:
        found.append(f"{position}: attempt(s) {twice} ran more than once")
    beyond = [a for a in ran if a > position.attempt]
    if beyond:
        found.append(f"{position}: ran attempt(s) {beyond} beyond the recorded attempt {position.attempt}")
    if position.status == "completed" and position.attempt not in ran:
        found.append(f"{position}: result of attempt {position.attempt} recorded, which never ran")
    return found, again


def run_problems(run: Run) -> list[str]:
    """What breaks the invariants on a run of the tree: not ended, still leased, or a history
    that fails replay."""
    found = []
    if run.status not in TERMINAL:
        found.append(f"run {run.id} still {run.status}")
    if run.locked_by is not None:
        found.append(f"run {run.id} still leased by {run.locked_by}")
    try:
        replay_history(histories.export(run))
    except Exception as exc:  # noqa: BLE001 - reported as the violation it is
        found.append(f"run {run.id}'s history fails replay: {exc!r}")
    return found


def wrap_commit(connection: Any, point: Callable[[str], Any]) -> None:
    """``connection.commit`` passing the points before and after the commit."""
    commit = connection.commit

    def committed() -> None:
        point("before commit")
        commit()
        point("after commit")

    connection.commit = committed


def explore(
    env: DurableEnv,
    scenario: Scenario,
    only: list[int] | None = None,
    fault: str = KILL,
    choose: Callable[[int], list[int]] | None = None,
) -> dict[str, Any]:
    """Run ``scenario`` fault-free, then killed at each of its crash points (``fault=KILL``), or
    with each message it receives lost (``DROP``), delivered twice (``DOUBLE``) or after the
    messages queued behind it (``REORDER``); return a report. ``only`` (the points' numbers) or
    ``choose`` (given how many there are) narrows that to some of them. Raises AssertionError
    naming the scenario, k, the point and the invariants broken."""
    explorer = Explorer(env, scenario)
    started = os.times().elapsed
    try:
        run_id, baseline = _fault_free(explorer)
        failures: list[str] = []
        post_mortem: Counter[str] = Counter()
        targets = [p for p in baseline.points if fault == KILL or p.startswith("receipt of")]
        chosen = only or (choose(len(targets)) if choose is not None else range(1, len(targets) + 1))
        for k in chosen:
            run_id, got = explorer.run([(fault, k)])
            post_mortem.update(got.post_mortem)
            assert got.killed_at is not None, f"{scenario.name}: point {k} never came (not deterministic?)"
            problems = explorer.violations(run_id, baseline, got)
            if problems:
                failures.append(f"{scenario.name} k={k} ({got.killed_at}): " + "; ".join(problems))
        assert not failures, "\n".join(failures)
        return {
            "points": len(targets),
            "post_mortem": dict(post_mortem),
            "seconds": round(os.times().elapsed - started, 1),  # not time.*: the clock is frozen
        }
    finally:
        explorer.uninstall()


def explore_schedule(env: DurableEnv, scenario: Scenario, faults: list[tuple[str, float]]) -> dict[str, Any]:
    """Run ``scenario`` fault-free, then once with ``faults`` one after another: each (fault,
    where) strikes at that fraction of the fault-free run's points of its kind, counted from
    where the fault before it struck (so a later one may find the run over before its point
    comes: the report says which struck). Raises AssertionError naming the faults and the
    invariants broken."""
    explorer = Explorer(env, scenario)
    try:
        run_id, baseline = _fault_free(explorer)
        receipts = sum(1 for p in baseline.points if p.startswith("receipt of"))
        schedule = [
            (fault, 1 + int(where * (len(baseline.points) if fault == KILL else receipts)))
            for fault, where in faults
        ]
        run_id, got = explorer.run(schedule)
        assert got.struck, f"{scenario.name}: the first fault {schedule[0]} never came (not deterministic?)"
        problems = explorer.violations(run_id, baseline, got)
        assert not problems, f"{scenario.name} with {got.struck}: " + "; ".join(problems)
        return {"schedule": schedule, "struck": got.struck, "post_mortem": got.post_mortem}
    finally:
        explorer.uninstall()


def _fault_free(explorer: Explorer) -> tuple[str, Outcome]:
    """The scenario's run without faults, every point counted: what the faulted runs must match."""
    run_id, baseline = explorer.run([])
    problems = explorer.violations(run_id, baseline, baseline)
    assert not problems, f"{explorer.scenario.name} fault-free: {problems}"
    assert baseline.status in TERMINAL
    return run_id, baseline
