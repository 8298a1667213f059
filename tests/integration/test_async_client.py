"""The async client (``durable.astart`` ... ``durable.aresult``) from coroutines, as an async view
calls it: every twin against ``durable_env`` and against real commits, with the sync twin's
signature and errors, no ``SynchronousOnlyOperation``, and waits that leave the loop free.

pytest-asyncio runs these coroutines: it is the asyncio plugin the Django world uses, and
durable's twins are asyncio code (asgiref, Django's async ORM); anyio's plugin would also run
each test on trio, which Django does not support. Its loop runs on the test's thread, so the
twins' thread-sensitive work runs on asgiref's one sync thread with a connection of its own:
the tests commit (``transaction=True``) so both threads see the rows, and close that thread's
connections after each test. A sync test that calls a twin through ``async_to_sync`` runs its
work on the test's own thread instead, inside the test's transaction, as a sync caller would.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest
import pytest_asyncio
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections, transaction

import durable
from durable import dispatch, results
from durable.engine import turn
from durable.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

TWINS = {
    "astart": durable.start,
    "asignal": durable.signal,
    "asignal_with_start": durable.signal_with_start,
    "aupdate": durable.update,
    "aquery": durable.query,
    "acancel": durable.cancel,
    "aretry": durable.retry,
    "aresult": durable.result,
    "aget_run": durable.get_run,
    "adebounce": durable.debounce,
    "awrite_stream": durable.write_stream,
}


@durable.step(local=True)
def add_one(value):
    return value + 1


@durable.workflow(name="tests.async_client_quick")
def quick(ctx, value):
    return ctx.step(add_one, value)


@durable.workflow(name="tests.async_client_order")
def order(ctx, given):
    ctx.expose("phase", "naming")
    rename = ctx.wait_for_update("rename")
    ctx.reply(rename, {"now": rename.payload})
    ctx.expose("phase", "paying")
    paid = ctx.wait_for_signal("paid")
    return {"given": given, "name": rename.payload, "paid": paid}


@durable.workflow(name="tests.async_client_fails")
def fails(ctx, _):
    raise durable.ApplicationError("no stock", code="out_of_stock", non_retryable=True)


@pytest_asyncio.fixture(autouse=True)
async def _sync_thread_connections_closed():
    """Close the connections of asgiref's sync thread: a test database that a connection still
    uses cannot be flushed or dropped."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def sent():
    """Messages the calls send, kept here (nothing runs them unless the test does)."""
    messages: list[dispatch.Message] = []
    with dispatch.using(dispatch.Transport(send=messages.append)):
        yield messages


def test_every_twin_has_its_sync_twins_signature():
    for name, sync in TWINS.items():
        twin = getattr(durable, name)
        assert inspect.iscoroutinefunction(twin), name
        assert list(inspect.signature(twin).parameters.values()) == list(
            inspect.signature(sync).parameters.values()
        ), name
    # The stream's reader is an async generator, with its sync twin's signature.
    assert inspect.isasyncgenfunction(durable.aread_stream)
    assert (
        inspect.signature(durable.aread_stream).parameters
        == inspect.signature(durable.read_stream).parameters
    )


@pytest.mark.asyncio
async def test_every_twin_drives_a_run_under_durable_env(durable_env):
    run_until_idle = sync_to_async(durable_env.run_until_idle)
    handle = await durable.astart(order, {"id": 7}, tags=["async"])
    assert isinstance(handle, durable.RunHandle)
    assert await handle.astatus() == "pending"
    await run_until_idle()
    assert await durable.aquery(handle.id, "phase") == "naming"
    assert await durable.aquery(handle.id) == {"phase": "naming"}
    update_id = await durable.aupdate(handle.id, "rename", "bob", idempotency_key="rename-1")
    assert isinstance(update_id, int)
    await run_until_idle()
    # The same key again sends nothing and answers with the first update's reply.
    reply = await durable.aupdate(handle.id, "rename", "bob", wait="1s", idempotency_key="rename-1")
    assert reply == {"now": "bob"}
    assert await durable.aquery(handle.id, "phase", timeout="1s") == "paying"
    with pytest.raises(durable.WaitTimeout, match="under durable_env"):
        await durable.aresult(handle.id, timeout="1s")
    await handle.asignal("paid", 12)
    await run_until_idle()
    assert await durable.aresult(handle.id) == {"given": {"id": 7}, "name": "bob", "paid": 12}
    assert await handle.aresult(timeout="1s") == {"given": {"id": 7}, "name": "bob", "paid": 12}
    row = await durable.aget_run(handle.id)
    assert (row.status, row.tags) == ("completed", ["async"])
    assert await durable.acancel(handle.id) is False


@pytest.mark.asyncio
async def test_signal_with_start_cancel_and_retry_twins_under_durable_env(durable_env):
    run_until_idle = sync_to_async(durable_env.run_until_idle)
    handle = await durable.asignal_with_start(order, {"id": 8}, run_id="async-sws", signal="paid", payload=3)
    assert handle == durable.RunHandle("async-sws")
    await durable.asignal("async-sws", "paid", 4, idempotency_key="second")
    await run_until_idle()
    assert await handle.acancel(reason="changed my mind") is True
    await run_until_idle()
    with pytest.raises(durable.RunCancelled):
        await handle.aresult()
    again = await durable.aretry("async-sws")
    assert again == handle
    assert await again.astatus() != "cancelled"


@pytest.mark.asyncio
async def test_the_twins_raise_what_their_sync_twins_raise(durable_env):
    with pytest.raises(durable.RunNotFound):
        await durable.aget_run("no-such-run")
    with pytest.raises(durable.RunNotFound):
        await durable.asignal("no-such-run", "paid")
    with pytest.raises(durable.InvalidInput):
        await durable.astart(quick, 1, run_id="")
    with pytest.raises(durable.InvalidInput):
        await durable.aresult("no-such-run", timeout="soon")
    with pytest.raises(durable.InvalidInput):
        await durable.asignal_with_start(quick, 1, run_id=None, signal="go")
    with pytest.raises(TypeError):
        await durable.asignal_with_start(quick, 1, "positional-run-id", signal="go")
    handle = await durable.astart(fails, None)
    await sync_to_async(durable_env.run_until_idle)()
    with pytest.raises(durable.RunFailed) as failed:
        await durable.aresult(handle.id)
    assert failed.value.code == "out_of_stock"
    with pytest.raises(durable.RunFinished):
        await durable.asignal(handle.id, "paid")


@pytest.mark.asyncio
async def test_without_a_transaction_the_message_leaves_at_once(sent):
    handle = await durable.astart(quick, 1)
    assert [(m.task, m.args) for m in sent] == [(dispatch.ADVANCE, (handle.id,))]


def test_inside_a_callers_transaction_the_message_leaves_on_commit(sent):
    # A sync caller's atomic block awaiting a twin: the twin writes on the caller's thread and
    # connection, so its run and message are the transaction's, as with Django's async ORM.
    with transaction.atomic():
        handle = async_to_sync(durable.astart)(quick, 1)
        assert sent == []
    assert [(m.task, m.args) for m in sent] == [(dispatch.ADVANCE, (handle.id,))]
    with transaction.atomic():
        gone = async_to_sync(durable.astart)(quick, 2)
        transaction.set_rollback(True)
    assert not Run.objects.filter(id=gone.id).exists()
    assert len(sent) == 1


@pytest.mark.django_db
def test_a_sync_test_awaits_the_twins_in_its_own_transaction(durable_env):
    handle = async_to_sync(durable.astart)(quick, 1)
    assert [m.task for m in durable_env.pending()] == [dispatch.ADVANCE]
    durable_env.run_until_idle()
    assert async_to_sync(durable.aresult)(handle.id) == 2
    assert transaction.get_connection().in_atomic_block  # pytest-django's, rolled back after


def _later(seconds, action):
    """Run ``action`` in a thread after ``seconds``, as a worker would end the run."""

    def run():
        try:
            time.sleep(seconds)
            action()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def _ticking(ticks: list[float]) -> None:
    while True:
        ticks.append(time.monotonic())
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_aresult_leaves_the_loop_and_the_sync_thread_free_while_it_waits(sent):
    handle = await durable.astart(quick, 41)
    ender = _later(1.0, lambda: turn.advance(handle.id))
    ticks: list[float] = []
    ticker = asyncio.create_task(_ticking(ticks))
    waiting = asyncio.create_task(durable.aresult(handle.id, timeout=20))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    # The twins share one sync thread: a wait parked on it would hold this read until the end.
    t0 = time.monotonic()
    assert (await durable.aget_run(handle.id)).status == "pending"
    assert time.monotonic() - t0 < 0.5
    assert await waiting == 42
    ticker.cancel()
    await asyncio.to_thread(ender.join)
    assert len(ticks) > 30  # about 100 while it waited, were the loop free


@pytest.mark.asyncio
async def test_aresult_times_out_as_result_does(sent, monkeypatch):
    handle = await durable.astart(quick, 1)
    with pytest.raises(durable.WaitTimeout) as late:
        await durable.aresult(handle.id, timeout="200ms")
    with pytest.raises(durable.WaitTimeout) as sync_late:
        await sync_to_async(durable.result)(handle.id, timeout="200ms")
    assert str(late.value) == str(sync_late.value)
    assert late.value.details == sync_late.value.details == {"status": "pending"}
    # Past the limit it raises even while the end notices are being waited on.
    monkeypatch.setattr(results, "NOTIFIED_POLL", 30.0)
    t0 = time.monotonic()
    with pytest.raises(durable.WaitTimeout) as bare:
        await durable.aresult(handle.id, timeout=0.3)
    assert time.monotonic() - t0 < 2
    # A timeout given as a bare number is said with its unit; one given as a duration, as given.
    assert str(bare.value).endswith("still pending after 0.3 s")
    assert str(late.value).endswith("still pending after 200ms")


@pytest.mark.asyncio
async def test_aquery_waits_for_the_value_without_blocking_the_loop(sent):
    handle = await durable.astart(order, {"id": 9})
    ender = _later(0.5, lambda: turn.advance(handle.id))
    ticks: list[float] = []
    ticker = asyncio.create_task(_ticking(ticks))
    assert await durable.aquery(handle.id, "phase", timeout=20) == "naming"
    ticker.cancel()
    await asyncio.to_thread(ender.join)
    assert len(ticks) > 15


@pytest.mark.asyncio
async def test_aresult_wakes_on_the_notice_the_ending_transaction_sends(postgres, sent, monkeypatch):
    # Polls 30 s apart: only the notice, awaited on the loop, can wake the caller in time.
    monkeypatch.setattr(results, "NOTIFIED_POLL", 30.0)
    handle = await durable.astart(quick, 1)
    ender = _later(0.5, lambda: turn.advance(handle.id))
    t0 = time.monotonic()
    assert await durable.aresult(handle.id, timeout=20) == 2
    assert 0.4 < time.monotonic() - t0 < 3
    await asyncio.to_thread(ender.join)
