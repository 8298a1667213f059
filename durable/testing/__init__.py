"""Pytest fixtures for projects that use durable (registered as a pytest plugin).

- ``durable_env``: durable's Celery messages are captured in-process (the env's ``transport``
  is installed for the test); ``run_until_idle()`` runs them, ``advance_time()`` moves a frozen
  clock and runs the sweeps, so timers fire at once.
- ``durable_worker``: a real ``celery worker`` subprocess on the configured broker and the test
  database, for end-to-end tests (with ``start_beat()``, ``kill()`` and ``restart()``), and
  ``add_worker()`` for more workers, each killable and restartable on its own; a test module
  configures it by overriding the ``durable_worker_options`` fixture.
- ``durable_env.crash(step, when=...)``: the process dies at a step attempt, then
  ``durable_env.recover()``; a project tests its own workflows' recovery so.
- ``replay_history(history)``: replay an exported history (``manage.py durable show RUN --json``)
  against the workflow code of the test, no database needed; raises ``NonDeterminismError``
  when the code would break the run.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from .. import clock, conf, dispatch
from ..durations import parse_duration
from ..errors import DurableError
from ..replay import check
from . import crashes
from .workers import (  # noqa: F401 - the plugin's fixtures and helpers, as before
    DurableWorker,
    WorkerHandle,
    _purge,
    cut_database_connections,
    durable_worker,
    durable_worker_options,
    flush_broker,
    settings_env,
)


class DurableEnv:
    """Runs durable's work in the test process, under a frozen clock."""

    def __init__(self, freezer: Any) -> None:
        from ..engine import first_turns

        first_turns.unfit.clear()  # each test a fresh process: nothing learned from the last
        self.messages: list[dispatch.Message] = []
        #: Messages sent with a countdown, and when they fall due.
        self.later: list[tuple[datetime, dispatch.Message]] = []
        #: The test process as durable sees it: a worker of every queue (a recorded result runs
        #: the next turn inline) that runs no step in place (each step's message stays visible),
        #: whose result() never waits for work nobody runs, with no thread renewing leases under
        #: the frozen clock.
        self.transport = dispatch.Transport(
            send=self.capture, served_queues=None, may_wait=False, keep_alive=False
        )
        self._freezer = freezer
        self._handlers: dict[str, Callable[..., Any]] = {}
        self._broker_down = False
        from django.db import connections

        # How deep the test framework's own atomic blocks go (0 under transactional_db).
        self._test_depth = len(connections[conf.get().DATABASE].atomic_blocks)

    def capture(self, message: dispatch.Message) -> None:
        if self._broker_down:
            raise ConnectionError("broker unreachable (durable_env.broker_down())")
        countdown = message.options.get("countdown")
        if countdown:
            # Held as a worker holds it, until the frozen clock reaches it (advance_time()).
            self.later.append((clock.now() + timedelta(seconds=countdown), message))
        else:
            self.messages.append(message)

    @contextlib.contextmanager
    def broker_down(self) -> Iterator[None]:
        """Make every publish inside the block fail, as an unreachable broker would."""
        self._broker_down = True
        try:
            yield
            self._commit_callbacks()  # what committed inside the block published inside it
        finally:
            self._broker_down = False

    def _run_celery_task(self, message: dispatch.Message) -> None:
        """Run an existing Celery task sent as a step, eagerly, and report it as its link would."""
        from celery import current_app

        from ..engine import results_by_message
        from ..errors import error_dict

        run_id, seq, attempt, token = message.options["headers"]["durable"]
        if message.task not in current_app.tasks:
            self._run_remote_step(message, run_id, seq, attempt, token)
            return
        result = current_app.tasks[message.task].apply(
            args=message.args, kwargs=message.options.get("kwargs")
        )
        if result.successful():
            results_by_message.step_result(run_id, seq, attempt, output=result.result, token=token)
        else:
            results_by_message.step_result(run_id, seq, attempt, error=error_dict(result.result), token=token)

    def _run_remote_step(
        self, message: dispatch.Message, run_id: str, seq: int, attempt: int, token: str
    ) -> None:
        """Run a remote step here as its worker would: from the message alone, reporting its
        heartbeats and its result as messages (durable.heartbeat, durable.step_result)."""
        from .. import codecs, remote
        from ..definitions import registry
        from ..engine import results_by_message
        from ..replay.attempt import run_attempt
        from ..replay.stepscope import StepInfo

        step = registry.step(message.task)
        # Opened and sealed under this process's codec, as durable.remote does on a worker.
        payload = remote.arguments(message.args, message.options.get("kwargs", {}))

        def beat(progress: Any = None) -> None:
            sealed = None if progress is None else codecs.sealed(progress, conf.codec())
            results_by_message.heartbeat(run_id, seq, attempt, sealed, token)

        info = StepInfo(run_id, seq, attempt, step.name, secret=token)
        output, error, retryable = run_attempt(step, info, payload, beat)
        if error is not None and not retryable:
            error = {**error, "non_retryable": True}
        output = codecs.sealed(output, conf.codec()) if error is None else None
        results_by_message.step_result(run_id, seq, attempt, output=output, error=error, token=token)

    def _handler(self, task: str) -> Callable[..., Any]:
        if not self._handlers:
            from .. import remote
            from ..engine import (
                decisions,
                entity_ops,
                redispatch,
                remote_turns,
                results_by_message,
                steps,
                wake_batches,
            )
            from ..engine.sweeps import SWEEPS

            self._handlers = {
                # A remote turn runs here as its database-less worker would: from the message alone.
                dispatch.REMOTE_TURN: lambda turn: remote.run_turn(turn),
                dispatch.DECISION: lambda **decision: decisions.apply(decision),
                dispatch.TURN_HEARTBEAT: remote_turns.heartbeat,
                dispatch.HEARTBEAT: results_by_message.heartbeat,
                dispatch.STEP_RESULT: results_by_message.step_result,
                dispatch.ADVANCE: wake_batches.advance_one,
                dispatch.ADVANCE_BATCH: wake_batches.advance_batch,
                dispatch.RUN_STEP: steps.run_step,
                dispatch.APPLY_ENTITY: entity_ops.apply,
                dispatch.PROBE: redispatch.probed,
                **{sweep.task: sweep.run for sweep in SWEEPS},
            }
        return self._handlers[task]

    def _commit_callbacks(self) -> None:
        # Under pytest-django's ``db`` the test never commits, so on-commit callbacks would never
        # run; run those left by transactions that did finish, as their real commit would.
        from django.db import connections

        connection = connections[conf.get().DATABASE]
        # Inside the test's own transaction.atomic(), callbacks wait for its end, as in production.
        if len(connection.atomic_blocks) > self._test_depth:
            return
        while connection.in_atomic_block and connection.run_on_commit:
            _, callback, _ = connection.run_on_commit.pop(0)
            callback()

    def pending(self) -> list[dispatch.Message]:
        """The messages sent and not yet run (those sent with a countdown, once it ran out)."""
        self._commit_callbacks()
        if self.later:
            now = clock.now()
            self.messages += [message for due, message in self.later if due <= now]
            self.later = [(due, message) for due, message in self.later if due > now]
        return list(self.messages)

    def drop(self, task: str | None = None) -> list[dispatch.Message]:
        """Lose the pending messages (of ``task``, or all), as a broker might; return them."""
        dropped = [m for m in self.pending() if task is None or m.task == task]
        self.messages[:] = [m for m in self.messages if m not in dropped]
        return dropped

    def run_next(self) -> dispatch.Message | None:
        """Run the oldest captured message, if any, and return it."""
        if not self.pending():
            return None
        message = self.messages.pop(0)
        if message.task.startswith("durable."):
            self._handler(message.task)(*message.args, **message.options.get("kwargs", {}))
        else:
            self._run_celery_task(message)
        return message

    def run_until_idle(self, max_tasks: int = 10_000) -> int:
        """Run captured messages, and what they send, until none is left; return how many ran."""
        ran = 0
        while self.pending():
            if ran == max_tasks:
                raise DurableError(
                    f"run_until_idle() ran {max_tasks} tasks and work is still coming: a workflow "
                    "that never settles? Raise max_tasks if this is expected"
                )
            self.run_next()
            ran += 1
        return ran

    def sweep(self) -> int:
        """Run the beat sweeps once, then everything they send."""
        from ..engine.sweeps import SWEEPS

        return sum(sweep.run() for sweep in SWEEPS) + self.run_until_idle()

    def advance_time(self, duration: Any) -> int:
        """Move the frozen clock forward in one jump, then fire what became due until idle."""
        delta = parse_duration(duration, what="advance_time()")
        self._freezer.tick(delta)
        ran = self.run_until_idle()
        while True:
            step = self.sweep()
            if not step:
                return ran
            ran += step

    def now(self) -> Any:
        return clock.now()

    def crash(
        self, step: Any, *, when: str = "before", attempt: int = 1
    ) -> contextlib.AbstractContextManager[crashes.Crash]:
        """Inside the block, the process dies at attempt ``attempt`` of ``step`` (a step or its
        name): as the attempt starts (``when="before"``: its body does not run) or once its body
        returned (``"after"``: its effects happened, its result is not recorded). The open
        transaction is rolled back and nothing after it runs; the message it was handling is
        delivered again; what it held stays held until ``recover()``. Raises ``DurableError`` at
        the block's end if the attempt never ran in it."""
        return crashes.crash(self, step, when, attempt)

    def recover(self) -> int:
        """Move the clock past ``LEASE``, so what a dead process held lapses and the sweeps
        take it up, then run what they send until idle; return how many messages ran. An
        attempt the death cut counts as lost: its retry waits out its backoff (``advance_time``)."""
        return self.advance_time(conf.get().LEASE + timedelta(seconds=1))


@pytest.fixture
def durable_env(request: pytest.FixtureRequest) -> Iterator[DurableEnv]:
    """Capture durable's messages in-process and freeze the clock; see DurableEnv."""
    import freezegun
    from django.utils import timezone

    if not any(name in request.fixturenames for name in ("db", "transactional_db", "django_db_setup")):
        request.getfixturevalue("db")
    from ..engine import sweeps

    sweeps.reset_passes()
    # pytest's own clock (its --durations, its junit times) keeps the real time.
    freezer = freezegun.freeze_time(timezone.now(), tick=False, ignore=["_pytest.timing"])
    frozen = freezer.start()
    env = DurableEnv(frozen)
    try:
        with dispatch.using(env.transport):
            yield env
    finally:
        freezer.stop()


@pytest.fixture(autouse=True)
def _durable_result_listeners_closed() -> Iterator[None]:
    """Close the connection ``durable.result()`` listens on after each test: a test database
    that a connection still uses cannot be dropped at the end of the session."""
    yield
    waiting = sys.modules.get("durable.waiting")  # not imported: no listener to close
    if waiting is not None:
        waiting.stop_all()


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60,
    interval: float = 0.1,
    what: str = "condition",
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; raise AssertionError past ``timeout``,
    with what ``explain`` says of the state it stopped in."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{said}")
        time.sleep(interval)


def replay_history(history: Any, workflow: Any = None) -> check.Verdict:
    """Replay an exported history against the workflow code installed now, as a deploy would.

    ``history`` is the JSON of ``manage.py durable show RUN --json`` (a dict, a JSON string, or
    a path to a file holding it); ``workflow`` (a ``@durable.workflow``) defaults to the
    registered one the history names. Nothing runs, is sent or is written: the body is walked
    over the recorded positions only. Raises the ``NonDeterminismError`` (or the
    ``WorkflowNotRegistered`` / ``InvalidInput``) that would break the run; returns the verdict.
    """
    from ..definitions import registry

    if isinstance(history, Path) or (isinstance(history, str) and not history.lstrip().startswith("{")):
        history = Path(history).read_text()
    if isinstance(history, str):
        history = json.loads(history)
    facts, records, at = check.from_json(history)
    definition = workflow if workflow is not None else registry.workflow(facts.workflow, facts.version)
    verdict = check.check(definition, facts, records, at=at)
    if verdict.error is not None:
        raise verdict.error
    return verdict
