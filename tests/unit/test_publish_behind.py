"""The publishing thread of a process that serves no queue (``durable.publish_behind``): every
wake handed over leaves once, a lone one at once, a burst's in lots, none lost at exit or
carried into a forked child."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from durable import publish_behind


class Recorder:
    def __init__(self, hold: threading.Event | None = None) -> None:
        self.lots: list[list[publish_behind.Wake]] = []
        self.threads: set[str] = set()
        self.hold = hold
        self.bound = 0

    def publish(self, lot: list[publish_behind.Wake]) -> None:
        if self.hold is not None:
            self.hold.wait(10)
        self.threads.add(threading.current_thread().name)
        self.lots.append(lot)

    def bind(self):
        def bound() -> None:
            self.bound += 1

        return bound

    def publisher(self) -> publish_behind.Publisher:
        return publish_behind.Publisher(self.publish, self.bind)

    @property
    def wakes(self) -> list[publish_behind.Wake]:
        return [wake for lot in self.lots for wake in lot]


def test_lots_keep_the_order_and_hold_at_most_a_batch():
    batch = publish_behind.BATCH
    run_ids = [f"r{i}" for i in range(batch + 3)]
    assert publish_behind.lots(run_ids) == [run_ids[:batch], run_ids[batch:]]
    assert publish_behind.lots(["r0"]) == [["r0"]]


def test_a_lone_wake_leaves_at_once_from_the_thread_bound_once(monkeypatch):
    monkeypatch.setattr(publish_behind, "LINGER", 30.0)  # it must not linger at all
    recorder = Recorder()
    publisher = recorder.publisher()
    began = time.monotonic()
    publisher.put("q", "r1")
    assert publisher.flush(5)
    assert time.monotonic() - began < 5
    publisher.put("q", "r2")
    assert publisher.flush(5)
    assert recorder.wakes == [("q", "r1"), ("q", "r2")]
    assert recorder.threads == {"durable-publisher"}
    assert recorder.bound == 1


def test_a_burst_leaves_in_lots_each_wake_once(monkeypatch):
    monkeypatch.setattr(publish_behind, "BURST_GAP", 60.0)  # every put counts as a burst
    monkeypatch.setattr(publish_behind, "LINGER", 5.0)
    recorder = Recorder()
    publisher = recorder.publisher()
    for i in range(30):
        publisher.put("q", f"r{i}")
    assert publisher.flush(10)
    assert [run_id for _, run_id in recorder.wakes] == [f"r{i}" for i in range(30)]
    # The thread lingered until a batch had gathered, then sent the rest as they came.
    assert len(recorder.lots[0]) >= publish_behind.BATCH
    assert len(recorder.lots) < 30


def test_a_lot_leaves_once_the_starts_pause_not_after_linger(monkeypatch):
    monkeypatch.setattr(publish_behind, "BURST_GAP", 0.2)
    monkeypatch.setattr(publish_behind, "LINGER", 30.0)
    recorder = Recorder()
    publisher = recorder.publisher()
    began = time.monotonic()
    for i in range(6):  # fewer than a batch, close together: a burst from the fifth on
        publisher.put("q", f"r{i}")
    deadline = time.monotonic() + 10
    while len(recorder.wakes) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [run_id for _, run_id in recorder.wakes] == [f"r{i}" for i in range(6)]
    assert time.monotonic() - began < 10  # LINGER is 30 s: the pause sent the lot
    assert max(len(lot) for lot in recorder.lots) > 1


def test_hurry_cuts_a_lingering_lot_short(monkeypatch):
    monkeypatch.setattr(publish_behind, "BURST_GAP", 60.0)
    monkeypatch.setattr(publish_behind, "LINGER", 60.0)
    recorder = Recorder()
    publisher = recorder.publisher()
    publisher.put("q", "r1")
    publisher.put("q", "r2")
    time.sleep(0.2)
    assert recorder.lots == []  # lingering for a batch
    began = time.monotonic()
    publisher.hurry()
    deadline = time.monotonic() + 10
    while not recorder.lots and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder.wakes == [("q", "r1"), ("q", "r2")]
    assert time.monotonic() - began < 10


def test_a_publish_that_raises_is_logged_and_the_next_lot_still_leaves(caplog):
    sent: list[list[publish_behind.Wake]] = []

    def publish(lot):
        if lot[0][1] == "bad":
            raise ConnectionError("broker down")
        sent.append(lot)

    publisher = publish_behind.Publisher(publish, lambda: lambda: None)
    publisher.put("q", "bad")
    assert publisher.flush(5)
    publisher.put("q", "good")
    assert publisher.flush(5)
    assert sent == [[("q", "good")]]
    assert "could not send 1 first turn(s)" in caplog.text


def test_with_no_thread_to_be_had_the_caller_publishes(monkeypatch, caplog):
    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    recorder = Recorder()
    publisher = recorder.publisher()
    publisher.put("q", "r1")  # does not raise: the run is committed
    assert recorder.wakes == [("q", "r1")]
    assert recorder.threads == {threading.current_thread().name}
    assert "sending in the caller" in caplog.text


def test_flush_waits_for_the_lot_being_published_and_says_when_it_timed_out():
    hold = threading.Event()
    recorder = Recorder(hold)
    publisher = recorder.publisher()
    publisher.put("q", "r1")
    assert publisher.flush(0.2) is False
    hold.set()
    assert publisher.flush(5) is True
    assert recorder.wakes == [("q", "r1")]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_sends_only_its_own_wakes():
    hold = threading.Event()
    recorder = Recorder(hold)
    publisher = publish_behind.publisher(recorder.publish, recorder.bind)
    publisher.put("q", "parent-1")  # held by the thread, or pending: either way the parent's
    publisher.put("q", "parent-2")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a thread of its own, nothing of the parent's
        try:
            hold.set()
            publisher.put("q", "child-1")
            ok = publisher.flush(5)
            os.write(write, repr((ok, recorder.wakes)).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        assert answer.read() == repr((True, [("q", "child-1")]))
    hold.set()
    assert publisher.flush(5)
    assert recorder.wakes == [("q", "parent-1"), ("q", "parent-2")]


def test_a_process_exiting_normally_waits_for_its_thread():
    script = (
        "import time\n"
        "from durable import publish_behind\n"
        "def publish(lot):\n"
        "    time.sleep(0.5)\n"
        "    print('sent', lot, flush=True)\n"
        "publisher = publish_behind.publisher(publish, lambda: lambda: None)\n"
        "publisher.put('q', 'last')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "sent [('q', 'last')]\n"
