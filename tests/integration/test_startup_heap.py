"""``DURABLE["FREEZE_GC_AT_START"]``: a worker's start-up objects frozen out of the collector's
sight, before its pool forks and in each pool process (the real worker: tests/e2e/test_workers.py)."""

from __future__ import annotations

import gc

import pytest
from django.test import override_settings

from durable import celery as wiring
from durable import conf
from durable.engine import leases


@pytest.fixture
def unfrozen(monkeypatch):
    # What a pool process's start sets beside, put back: this process must not end itself at a
    # step's hard time limit.
    monkeypatch.setattr(leases, "may_exit", leases.may_exit)
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process's collector as it was


def test_a_worker_freezes_what_it_built_at_its_start_and_each_pool_process_again(unfrozen):
    assert gc.get_freeze_count() == 0
    wiring._freeze_startup_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 10_000
    kept = [[] for _ in range(1000)]  # built after worker_init, before the fork
    assert _seen_by_the_collector(kept) == len(kept)
    wiring._pool_child()
    # Counted by identity, not by the freeze count: frozen start-up objects freed since lower it.
    assert _seen_by_the_collector(kept) == 0


def _seen_by_the_collector(objects):
    tracked = {id(each) for each in gc.get_objects()}  # every generation but the frozen one
    return sum(id(each) in tracked for each in objects)


@override_settings(DURABLE={"FREEZE_GC_AT_START": False})
def test_turned_off_the_collector_sees_everything(unfrozen):
    wiring._freeze_startup_heap()
    wiring._pool_child()
    assert gc.get_freeze_count() == 0


def test_freeze_gc_at_start_must_be_a_bool():
    assert conf.problems({"FREEZE_GC_AT_START": "yes"}) == [
        ("FREEZE_GC_AT_START", "must be True or False, got 'yes'")
    ]
    assert conf.problems({"FREEZE_GC_AT_START": False}) == []
