"""``durable.debounce``: a burst of calls for one key starts one run with the last call's input,
once ``period`` passed without another call, or ``max_wait`` after the first; a call after that
run started begins the next burst. Concurrent calls on PostgreSQL gather into one run."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

import durable
from durable.models import Run

pytestmark = pytest.mark.django_db

SEEN: list[object] = []


@durable.step(name="tests.debounce.index")
def index(doc):
    SEEN.append(doc)
    return doc


@durable.workflow(name="tests.debounce.reindex")
def reindex(ctx, doc):
    return ctx.step(index, doc)


@durable.workflow(name="tests.debounce.bounded", timeout="1h")
def bounded(ctx, doc):
    return doc


@durable.workflow(name="tests.debounce.one_at_a_time", singleton=durable.Singleton(key="{}"))
def one_at_a_time(ctx, doc):
    return doc


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()


def test_a_burst_starts_one_run_with_the_last_input_once_the_period_passed_quietly(durable_env):
    first = durable.debounce(reindex, {"v": 1}, key="doc-7", period="10s")
    durable_env.advance_time("6s")
    second = durable.debounce(reindex, {"v": 2}, key="doc-7", period="10s")
    durable_env.advance_time("6s")  # 12 s after the first call, 6 s after the last: not yet
    third = durable.debounce(reindex, {"v": 3}, key="doc-7", period="10s")
    assert first == second == third
    assert Run.objects.get(id=first.id).status == "pending" and SEEN == []
    durable_env.advance_time("9s")
    assert SEEN == []
    durable_env.advance_time("1s")
    assert durable.result(first.id) == {"v": 3} and SEEN == [{"v": 3}]
    assert Run.objects.filter(workflow="tests.debounce.reindex").count() == 1


def test_max_wait_bounds_the_delay_of_a_burst_that_never_pauses(durable_env):
    run = durable.debounce(reindex, 0, key="k", period="10s", max_wait="25s")
    for n in range(1, 5):  # a call every 5 s: the period never passes quietly
        durable_env.advance_time("5s")
        assert durable.debounce(reindex, n, key="k", period="10s", max_wait="25s") == run
    durable_env.advance_time("5s")
    assert Run.objects.get(id=run.id).status == "completed"  # started at 25 s, with 20 s's input
    assert SEEN == [4]


def test_a_call_after_the_run_started_begins_the_next_burst(durable_env):
    first = durable.debounce(reindex, "a", key="k", period="1s")
    durable_env.advance_time("1s")
    assert durable.result(first.id) == "a"
    second = durable.debounce(reindex, "b", key="k", period="1s")
    assert second != first
    durable_env.advance_time("1s")
    assert durable.result(second.id) == "b" and SEEN == ["a", "b"]


def test_keys_and_workflows_debounce_apart(durable_env):
    a = durable.debounce(reindex, "a", key="one", period="1s")
    b = durable.debounce(reindex, "b", key="two", period="1s")
    c = durable.debounce(bounded, "c", key="one", period="1s")
    assert len({a, b, c}) == 3
    durable_env.advance_time("1s")
    assert sorted(SEEN) == ["a", "b"] and durable.result(c.id) == "c"


def test_a_cancelled_burst_leaves_the_key_to_the_next_call(durable_env):
    first = durable.debounce(reindex, "a", key="k", period="10s")
    durable.cancel(first.id)
    assert Run.objects.get(id=first.id).status == "cancelled"
    second = durable.debounce(reindex, "b", key="k", period="10s")
    assert second != first
    durable_env.advance_time("10s")
    assert durable.result(second.id) == "b" and SEEN == ["b"]


def test_a_signal_to_a_gathering_run_waits_for_it(durable_env):
    run = durable.debounce(reindex, "a", key="k", period="10s")
    durable.signal(run.id, "early", 1)
    durable_env.run_until_idle()
    assert Run.objects.get(id=run.id).status == "pending" and SEEN == []
    durable_env.advance_time("10s")
    assert durable.result(run.id) == "a"


def test_the_deadline_counts_from_the_start_the_burst_got(durable_env):
    run = durable.debounce(bounded, 1, key="k", period="10s")
    durable_env.advance_time("5s")
    durable.debounce(bounded, 2, key="k", period="10s")
    row = Run.objects.get(id=run.id)
    assert row.deadline - row.wake_at == bounded.timeout


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "", "period": "1s"}, "key must be a non-empty string"),
        ({"key": "k", "period": "0s"}, "period must be longer than zero"),
        ({"key": "k", "period": "soon"}, "period 'soon' is not a duration"),
        ({"key": "k", "period": "10s", "max_wait": "5s"}, "max_wait (0:00:05) must be at least period"),
        ({"key": "x" * 201, "period": "1s"}, "key is 201 characters long; at most 200 fit"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_stored(durable_env, kwargs, message):
    with pytest.raises(durable.InvalidInput) as raised:
        durable.debounce(reindex, 1, **kwargs)
    assert message in str(raised.value)
    assert not Run.objects.exists()


def test_a_singleton_workflow_is_refused_until_debounce_takes_it(durable_env):
    with pytest.raises(durable.InvalidInput, match="waits in a line of its own"):
        durable.debounce(one_at_a_time, 1, key="k", period="1s")


@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_gather_into_one_run(durable_env):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite takes one writer at a time: there is no race to lose")
    ids: list[str] = []
    barrier = threading.Barrier(8)

    def call(n: int) -> None:
        barrier.wait()
        try:
            ids.append(durable.debounce(reindex, n, key="hot", period="10s").id)
        finally:
            connection.close()

    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert Run.objects.filter(workflow="tests.debounce.reindex").count() == 1
