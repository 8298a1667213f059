"""Step time limits enforced in the process that runs the step (``durable.engine.timelimits``):
the soft limit raises StepTimeout inside the step, by SIGALRM in the main thread and from the
watchdog in any other thread; the hard limit records the timeout, in any thread."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta

import pytest

import durable
from durable.engine import timelimits

GRACE = timedelta(seconds=0.5)


def _never(why: str) -> bool:
    raise AssertionError(f"the hard limit was reached: {why}")


def _busy(seconds: float) -> None:
    """Pure Python work, where an asynchronous exception lands."""
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(0.01)


def test_the_soft_limit_raises_step_timeout_in_the_main_thread_even_in_a_blocking_call():
    began = time.monotonic()
    with (
        pytest.raises(durable.StepTimeout) as raised,
        timelimits.Guard("step 'x'", timedelta(seconds=0.3), None, GRACE, _never),
    ):
        time.sleep(5)  # one blocking call, cut short by the signal
    assert time.monotonic() - began < 2
    assert "ran past its timeout" in str(raised.value)


def test_the_soft_limit_raises_step_timeout_in_another_thread():
    caught: list[BaseException] = []

    def step() -> None:
        try:
            with timelimits.Guard("step 'x'", timedelta(seconds=0.3), None, GRACE, _never):
                _busy(5)
        except BaseException as exc:  # noqa: BLE001 - what the step saw
            caught.append(exc)

    thread = threading.Thread(target=step)
    thread.start()
    thread.join(5)
    assert [type(exc) for exc in caught] == [durable.StepTimeout]


def test_beats_keep_a_heartbeat_timeout_from_firing_and_silence_fires_it():
    with timelimits.Guard("step 'x'", None, timedelta(seconds=0.4), GRACE, _never) as guard:
        for _ in range(8):  # 1.6 s in all, beating every 0.2 s
            time.sleep(0.2)
            guard.beat()
    with (
        pytest.raises(durable.StepTimeout) as raised,
        timelimits.Guard("step 'x'", None, timedelta(seconds=0.4), GRACE, _never) as guard,
    ):
        guard.beat()
        time.sleep(5)
    assert "gave no heartbeat" in str(raised.value)


@pytest.mark.parametrize("in_main_thread", [True, False], ids=["main thread", "other thread"])
def test_a_step_that_swallows_the_soft_limit_is_recorded_as_timed_out_at_the_hard_one(in_main_thread):
    recorded: list[tuple[str, float]] = []
    began = time.monotonic()

    def on_hard(why: str) -> bool:
        recorded.append((why, time.monotonic() - began))
        return True

    def step() -> None:
        with timelimits.Guard("step 'x'", timedelta(seconds=0.3), None, GRACE, on_hard):
            while not recorded:
                with contextlib.suppress(durable.StepTimeout):  # swallowed: only the hard limit ends it
                    _busy(0.1)

    if in_main_thread:
        step()
    else:
        thread = threading.Thread(target=step)
        thread.start()
        thread.join(10)
    ((why, at),) = recorded
    assert "ran past its timeout" in why and "did not stop" in why
    assert 0.8 <= at < 5  # the soft limit plus the grace, not before


def test_a_step_that_ends_in_time_leaves_no_timer_behind():
    with timelimits.Guard("step 'x'", timedelta(seconds=0.3), None, GRACE, _never):
        pass
    time.sleep(0.6)  # past where the soft limit was: nothing is raised here
    assert timelimits._armed is None


@durable.step(name="tests.unit_limits.local_timed", local=True, timeout="5s")
def local_timed() -> str:
    return "ran"


def test_a_turn_without_a_watchdog_refuses_a_local_step_with_a_limit_instead_of_running_it_unbounded():
    from .replaykit import turn

    outcome = turn(lambda ctx, _: ctx.step(local_timed)).outcome
    assert outcome.status == "failed" and outcome.error is not None
    assert "cannot enforce (a remote turn runs no watchdog)" in outcome.error["message"]
