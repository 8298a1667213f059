"""Hostile or careless workflow bodies through the engine: a swallowed suspension, a
BaseException escaping the body, a turn past TURN_TIME_LIMIT, a body that never calls a
primitive stopped from the lease keeper, a cancel reaching a running turn."""

# ruff: noqa: SIM105  (the bodies under test swallow exceptions on purpose)

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.test import override_settings

import durable
from durable import conf
from durable.engine import leases
from durable.models import Run

pytestmark = pytest.mark.django_db

#: The frozen clock of the running test, for bodies that let time pass.
FREEZER: dict[str, Any] = {}
#: Set by a test to let a looping body return.
RELEASE = threading.Event()
#: Set by a spinning body once it spins: the keeper stand-in acts only then, however slow the
#: claim. A plain flag, not an Event: the keeper's stop may land anywhere in the body, and inside
#: Event.set() it would leave the Event's lock held.
SPINNING: dict[str, bool] = {}


@pytest.fixture
def env(durable_env):
    FREEZER["clock"] = durable_env._freezer
    RELEASE.clear()
    SPINNING.clear()
    yield durable_env
    RELEASE.set()


@durable.step(name="tests.bodies.fetch")
def fetch() -> str:
    return "fetched"


@durable.workflow(name="tests.bodies.swallows")
def swallows(ctx, _):
    out = "skipped"
    try:
        out = ctx.step(fetch)
    except BaseException:  # noqa: BLE001 - the careless body under test
        pass
    return out


def test_a_body_that_swallows_its_suspension_waits_for_the_step_all_the_same(env):
    run = durable.start(swallows)
    env.run_until_idle()
    record = durable.get_run(run.id)
    assert (record.status, record.output) == ("completed", "fetched")


@durable.workflow(name="tests.bodies.interrupted")
def interrupted(ctx, kind):
    ctx.now()
    raise KeyboardInterrupt("^C in the body") if kind == "interrupt" else SystemExit(2)


@pytest.mark.parametrize(
    ("kind", "error"), [("interrupt", ("KeyboardInterrupt", "^C in the body")), ("exit", ("SystemExit", "2"))]
)
def test_keyboard_interrupt_or_system_exit_in_a_body_fails_the_run_with_its_cause(env, kind, error):
    run = durable.start(interrupted, kind)
    env.run_until_idle()  # the exception does not escape the turn
    record = durable.get_run(run.id)
    assert record.status == "failed"
    assert (record.error["type"], record.error["message"]) == error


@durable.workflow(name="tests.bodies.slow_body")
def slow_body(ctx, _):
    FREEZER["clock"].tick(120)  # two minutes of pure Python, then a primitive
    return ctx.now().isoformat()


@override_settings(DURABLE={"TURN_TIME_LIMIT": "1m", "MAX_RECOVERY_ATTEMPTS": 2})
def test_a_turn_past_turn_time_limit_is_given_back_as_crashed_until_the_run_dies(env):
    run = durable.start(slow_body)
    env.run_until_idle()
    row = Run.objects.get(id=run.id)
    assert (row.status, row.recovery_attempts, row.locked_by) == ("dead", 2, None)
    assert row.error["code"] == "max_recovery_attempts"
    assert row.error["details"]["cause"] == "turn_time_limit"
    assert "ran past TURN_TIME_LIMIT (0:01:00)" in row.error["message"]
    assert row.error["details"]["recovery_attempts"] == 3


@override_settings(DURABLE={"TURN_TIME_LIMIT": "1m"})
def test_a_turn_given_back_once_is_counted_and_runs_again(env):
    run = durable.start(slow_body)
    env.run_next()  # the first turn only
    row = Run.objects.get(id=run.id)
    assert (row.status, row.recovery_attempts, row.locked_by) == ("suspended", 1, None)
    assert [m.args for m in env.pending()] == [(run.id,)]


@durable.workflow(name="tests.bodies.spins")
def spins(ctx, swallow):
    ctx.now()
    while not RELEASE.is_set():
        if swallow:
            try:
                SPINNING["now"] = True  # in the try: the keeper's stop can only land where it is swallowed
                while not RELEASE.is_set():
                    pass
            except BaseException:  # noqa: BLE001 - a body that swallows even the keeper's stop
                pass
        else:
            SPINNING["now"] = True
    return "released"


def _keeper(first: Any, passes: list[float]) -> threading.Thread:
    """Stand in for the lease keeper thread: once the turn runs, do ``first``, then run the
    keeper's pass after each delay (seconds)."""

    def work() -> None:
        try:
            deadline = time.monotonic() + 30
            while not SPINNING and time.monotonic() < deadline:
                time.sleep(0.01)
            first()
            for delay in passes:
                if RELEASE.wait(delay):
                    return
                leases._watch_turns(conf.get())
        finally:
            RELEASE.set()  # a test that failed must still end

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


@override_settings(DURABLE={"TURN_TIME_LIMIT": "1m"})
def test_a_body_looping_without_primitives_is_stopped_by_the_keeper_past_the_limit(env, monkeypatch):
    monkeypatch.setattr(leases, "HELD_CHECK_EVERY", 3600.0)  # no lease check: this thread has no DB
    run = durable.start(spins, False)
    keeper = _keeper(lambda: FREEZER["clock"].tick(61), [0.0, 5.0])
    env.run_next()
    assert not RELEASE.is_set()  # stopped by the keeper, not released by the test
    row = Run.objects.get(id=run.id)
    assert (row.status, row.recovery_attempts) == ("suspended", 1)
    RELEASE.set()
    keeper.join()
    assert leases._watched == {}


@pytest.mark.django_db(transaction=True)
@override_settings(DURABLE={"TURN_TIME_LIMIT": "1m"})
def test_a_body_that_swallows_the_keepers_stop_is_abandoned_and_its_run_handed_back(env, monkeypatch, caplog):
    monkeypatch.setattr(leases, "HELD_CHECK_EVERY", 3600.0)
    monkeypatch.setattr(leases, "ABANDON_AFTER", 0.2)
    run = durable.start(spins, True)
    env.pending()
    states: list[tuple[str, int]] = []

    def look() -> None:
        row = Run.objects.get(id=run.id)
        states.append((row.status, row.recovery_attempts))

    # Passes until one finds the stop ignored for ABANDON_AFTER (the second, on a quiet machine).
    keeper = _keeper(lambda: FREEZER["clock"].tick(61), [0.0, 0.5, 1.0, 2.0, 4.0])
    original = leases._abandon

    def abandon(run_id: str, entry: Any) -> None:
        original(run_id, entry)
        look()  # while the body still spins: the run is already handed back
        RELEASE.set()  # then let the body end: no later pass is needed

    monkeypatch.setattr(leases, "_abandon", abandon)
    env.run_next()
    keeper.join()
    assert states == [("suspended", 1)]
    assert "ignored being stopped" in caplog.text
    assert Run.objects.get(id=run.id).recovery_attempts == 1  # the turn's own give-back found it gone


@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_running_turn_that_never_calls_a_primitive(env, monkeypatch):
    monkeypatch.setattr(leases, "HELD_CHECK_EVERY", 0.0)
    run = durable.start(spins, False)
    env.pending()
    keeper = _keeper(lambda: durable.cancel(run.id), [0.0, 5.0])
    env.run_next()
    assert not RELEASE.is_set()
    keeper.join()
    row = Run.objects.get(id=run.id)
    assert (row.status, row.locked_by, row.recovery_attempts) == ("cancelled", None, 0)
