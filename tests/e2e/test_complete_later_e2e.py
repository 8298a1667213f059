"""A step completed from outside on real workers: the attempt that raised CompleteLater outlives
its worker (it is held by no process, so no restart or sweep counts it lost), and the token
settles it from another process."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest

import durable
from durable.models import Checkpoint
from durable.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TOKENS = Path(tempfile.gettempdir()) / "durable-e2e-complete-later"


@pytest.fixture
def durable_worker_options():
    # A restart under the same INSTANCE_ID lets go of every hold its predecessor had at once.
    return {"env": {"DURABLE_INSTANCE_ID": "complete-later-w1", "DURABLE_LEASE": "2s"}}


def hand_out_the_token() -> None:
    """Leave the attempt's token where the test (the other system) reads it, and let go."""
    TOKENS.mkdir(exist_ok=True)
    info = durable.step_info()
    (TOKENS / info.run_id).write_text(info.token)
    raise durable.CompleteLater()


@durable.step
def ask_a_human(order: int) -> None:
    hand_out_the_token()


@durable.workflow(name="tests.e2e_complete_later")
def approval(ctx, order):
    return {"order": order, "answer": ctx.step(ask_a_human, order)}


def wait_for_the_let_go(run_id: str) -> None:
    """No process holds the attempt, and it is open as if sent: a step run in place is written so
    only once it raised CompleteLater; before that, its turn's lease holds it and a kill loses it."""
    wait_for(
        lambda: Checkpoint.objects.filter(
            run_id=run_id, seq=0, held_by=None, enqueued_at__isnull=False
        ).exists(),
        30,
        what="the let-go",
    )


def test_an_attempt_completed_later_survives_its_worker_and_settles_once(durable_worker):
    run = durable.start(approval, 3)
    token_file = TOKENS / run.id
    wait_for(token_file.exists, 60, what="the step to hand out its token")
    wait_for_the_let_go(run.id)
    durable_worker.kill()
    durable_worker.restart()
    durable_worker.start_beat()
    wait_for(lambda: durable.get_run(run.id).status == "suspended", 30, what="the run to rest")
    time.sleep(3)  # more than a lease, with beat's orphan sweeps running
    position = Checkpoint.objects.get(run_id=run.id, seq=0)
    assert (position.status, position.attempt) == ("pending", 1)
    durable.complete_step(token_file.read_text(), "approved")
    assert durable.result(run.id, timeout=30) == {"order": 3, "answer": "approved"}
    with pytest.raises(durable.DurableError, match="settled already"):
        durable.complete_step(token_file.read_text(), "again")


@durable.step(heartbeat_timeout="3s", retry=durable.Retry(max_attempts=1))
def ask_a_slow_system(order: int) -> None:
    hand_out_the_token()


@durable.workflow(name="tests.e2e_complete_later_beating")
def slow_approval(ctx, order):
    return ctx.step(ask_a_slow_system, order)


@durable.step(heartbeat_timeout="6s", retry=durable.Retry(max_attempts=1))
def ask_a_beating_system(order: int) -> None:
    hand_out_the_token()


@durable.workflow(name="tests.e2e_complete_later_kept_alive")
def kept_alive(ctx, order):
    return ctx.step(ask_a_beating_system, order)


def test_the_other_system_keeps_an_attempt_alive_by_its_token_through_a_worker_sigkill(durable_worker):
    """Temporal's async completion: the system doing the work beats by token (``heartbeat_step``),
    so the attempt outlives its ``heartbeat_timeout`` many times over, its worker killed between.
    The timeout counts from the let-go; 6 s leaves a loaded machine's test process room between
    seeing the let-go and its first beat, and between two beats while the worker restarts. The
    other system beats until the test has seen the restart through and read the position: beats
    that stopped on a clock of their own while a loaded machine's restart took longer than the
    timeout would let the attempt time out rightly."""
    durable_worker.start_beat()
    run = durable.start(kept_alive, 5)
    token_file = TOKENS / run.id
    wait_for(token_file.exists, 60, what="the step to hand out its token")
    token = token_file.read_text()
    # The kill comes after the let-go: a loaded machine's turn may not have written it 2 s after
    # the token was handed out, and an attempt still held by the killed turn is lost (and failed).
    wait_for_the_let_go(run.id)
    beats: list[tuple[float, float, object]] = []  # (began, took, answer or error) of each beat
    done = threading.Event()
    began = time.monotonic()

    def other_system() -> None:  # beats on its own, whatever happens to the worker meanwhile
        while not done.is_set():
            at = time.monotonic()
            try:
                answer: object = durable.heartbeat_step(token, {"done": round(at - began, 1)})
            except durable.DurableError as exc:  # the attempt ended: the assertions below say how
                answer = repr(exc)
            beats.append((round(at - began, 1), round(time.monotonic() - at, 2), answer))
            if answer is not True:
                return
            done.wait(0.5)

    beating = threading.Thread(target=other_system)
    beating.start()
    time.sleep(2)
    durable_worker.kill()
    durable_worker.restart()
    durable_worker.start_beat()
    time.sleep(max(0.0, 13 - (time.monotonic() - began)))  # more than twice the heartbeat_timeout
    position = Checkpoint.objects.get(run_id=run.id, seq=0)
    done.set()
    beating.join()
    said = (position.status, position.error, beats)
    assert beats and all(answer is True for *_, answer in beats), said
    assert (position.status, position.attempt) == ("pending", 1) and position.progress["done"] > 12, said
    durable.complete_step(token, "approved")
    assert durable.result(run.id, timeout=30) == "approved"


def test_an_attempt_whose_beats_by_token_stop_times_out(durable_worker):
    durable_worker.start_beat()
    run = durable.start(slow_approval, 6)
    token_file = TOKENS / run.id
    wait_for(token_file.exists, 60, what="the step to hand out its token")
    assert durable.heartbeat_step(token_file.read_text(), {"done": 1}) is True
    # Silent past heartbeat_timeout and its grace: the attempt fails, and with it the run.
    wait_for(lambda: durable.get_run(run.id).status == "failed", 30, what="the timeout")
    assert Checkpoint.objects.get(run_id=run.id, seq=0).error["code"] == "timeout"
    with pytest.raises(durable.InvalidInput, match="no open step attempt"):
        durable.heartbeat_step(token_file.read_text(), {"done": 2})  # the other system stops
