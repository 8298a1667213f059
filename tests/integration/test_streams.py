"""Streams: ``ctx.write_stream`` / ``ctx.close_stream`` in a body (once per position, however
often it is replayed), ``durable.write_stream`` in a step (once per attempt, in order), and
``durable.read_stream`` reading them in order until the stream is closed or the run ends."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

import durable
from durable.models import StreamHead, StreamValue

pytestmark = pytest.mark.django_db


@durable.step(name="tests.streams.words")
def words(prompt):
    for word in prompt.split():
        durable.write_stream("tokens", word)
    return len(prompt.split())


@durable.step(name="tests.streams.flaky", retry=durable.Retry(max_attempts=2, initial="1s"))
def flaky(n):
    durable.write_stream("tokens", f"attempt {durable.step_info().attempt}")
    if durable.step_info().attempt == 1:
        raise ConnectionError("try again")
    return n


@durable.workflow(name="tests.streams.agent")
def agent(ctx, prompt):
    ctx.write_stream("progress", {"stage": "start"})
    n = ctx.step(words, prompt)
    ctx.write_stream("progress", {"stage": "done", "cost": Decimal("1.50")})
    ctx.close_stream("progress")
    ctx.sleep("1m")  # the run goes on; the progress stream is over
    return n


@durable.workflow(name="tests.streams.retried")
def retried(ctx, n):
    return ctx.step(flaky, n)


@durable.workflow(name="tests.streams.closed_then_written")
def closed_then_written(ctx, _):
    ctx.close_stream("s")
    ctx.write_stream("s", 1)


@durable.workflow(name="tests.streams.not_storable")
def not_storable(ctx, _):
    ctx.write_stream("s", object())


def test_a_bodys_writes_are_stored_once_and_read_in_order_with_their_types(durable_env):
    run = durable.start(agent, "the quick fox")
    durable_env.run_until_idle()  # several turns: each replays the body's earlier writes
    assert list(durable.read_stream(run.id, "progress")) == [
        {"stage": "start"},
        {"stage": "done", "cost": Decimal("1.50")},
    ]
    assert StreamValue.objects.filter(run_id=run.id, key="progress").count() == 2
    assert StreamHead.objects.get(run_id=run.id, key="progress").closed
    durable_env.advance_time("1m")
    assert durable.result(run.id) == 3
    assert list(durable.read_stream(run.id, "tokens")) == ["the", "quick", "fox"]  # the run ended


def test_a_retried_step_writes_again_once_per_attempt(durable_env):
    run = durable.start(retried, 7)
    durable_env.run_until_idle()
    durable_env.advance_time("2s")
    assert durable.result(run.id) == 7
    assert list(durable.read_stream(run.id, "tokens")) == ["attempt 1", "attempt 2"]


def test_a_write_after_the_body_closed_its_stream_fails_the_run(durable_env):
    run = durable.start(closed_then_written)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed, match="stream 's' was closed by this run"):
        durable.result(run.id)
    assert list(durable.read_stream(run.id, "s")) == []


def test_a_value_that_cannot_be_stored_fails_the_body_naming_it(durable_env):
    run = durable.start(not_storable)
    durable_env.run_until_idle()
    with pytest.raises(durable.RunFailed, match="the value written to stream 's'"):
        durable.result(run.id)


def test_delete_run_deletes_its_streams(durable_env):
    run = durable.start(agent, "a b")
    durable_env.run_until_idle()
    assert StreamValue.objects.filter(run_id=run.id).exists()
    durable.cancel(run.id)
    durable.delete_run(run.id)
    assert not StreamValue.objects.filter(run_id=run.id).exists()
    assert not StreamHead.objects.filter(run_id=run.id).exists()


def test_bad_calls_are_refused(durable_env):
    with pytest.raises(durable.RunNotFound):
        durable.read_stream("no-such-run", "s")
    run = durable.start(agent, "a")
    with pytest.raises(durable.InvalidInput, match="stream key of 1 to 200 characters"):
        durable.read_stream(run.id, "")
    with pytest.raises(durable.DurableError, match="only inside a step that durable runs"):
        durable.write_stream("s", 1)


def test_the_run_page_shows_each_stream_with_its_last_values(durable_env, admin_client):
    run = durable.start(agent, "the quick fox")
    durable_env.run_until_idle()

    html = admin_client.get(reverse("admin:durable_run_change", args=[run.id])).content.decode()

    streams = html.split('id="streams"', 1)[1].split("</table>", 1)[0]
    assert "progress</td><td>2 (closed)" in streams and "tokens</td><td>3</td>" in streams
    assert "&quot;stage&quot;: &quot;start&quot;" in streams and "(step at position 1, attempt 1)" in streams


def test_a_write_tried_again_after_a_lost_commit_answer_is_stored_once(durable_env):
    from django.utils import timezone

    from durable.models.streams import ALREADY, APPENDED, CLOSED

    run = durable.start(agent, "a")
    heads = StreamHead.objects.all()
    write = {"seq": 1, "attempt": 1, "index": 0, "now": timezone.now()}
    assert heads.append(run.id, "k", "v", **write) == APPENDED
    assert heads.append(run.id, "k", "v", **write) == ALREADY  # the same writer's same write
    assert heads.append(run.id, "k", "w", **{**write, "index": 1}) == APPENDED
    assert list(StreamValue.objects.filter(run_id=run.id, key="k").values_list("position", "value")) == [
        (0, "v"),
        (1, "w"),
    ]
    heads.close(run.id, "k")
    assert heads.append(run.id, "k", "x", **{**write, "index": 2}) == CLOSED
    assert heads.get(run_id=run.id, key="k").next_position == 2
