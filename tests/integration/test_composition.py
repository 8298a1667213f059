"""Composition through durable_env: fans, child runs, continue-as-new and workflow deadlines."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import durable
from durable.models import Checkpoint, Run, Signal

pytestmark = pytest.mark.django_db

CALLS: list[tuple[str, object]] = []


@pytest.fixture(autouse=True)
def _clear():
    CALLS.clear()


@durable.step
def square(n):
    CALLS.append(("square", n))
    return n * n


@durable.step(retry=durable.Retry(max_attempts=1))
def fail_on(n, bad):
    if n in bad:
        raise durable.ApplicationError(f"{n} is bad", code="bad_item", details={"n": n})
    return n


@durable.workflow(name="tests.comp_map")
def map_flow(ctx, n):
    return ctx.map(square, list(range(n)))


@durable.workflow(name="tests.comp_all_fails")
def all_fails_flow(ctx, bad):
    try:
        ctx.all([ctx.defer(fail_on, n, bad) for n in range(4)])
    except durable.GatherError as exc:
        return {"code": exc.code, "errors": [e.details for e in exc.errors]}


@durable.workflow(name="tests.comp_settled")
def settled_flow(ctx, bad):
    outcomes = ctx.all_settled([ctx.defer(fail_on, n, bad) for n in range(3)])
    return [[o.ok, o.value, o.error.code if o.error else None] for o in outcomes]


@durable.workflow(name="tests.comp_child")
def child_flow(ctx, n):
    return ctx.step(square, n) + 1


@durable.workflow(name="tests.comp_failing_child")
def failing_child_flow(ctx, n):
    raise durable.ApplicationError("child broke", code="child_code")


@durable.workflow(name="tests.comp_parent")
def parent_flow(ctx, n):
    first = ctx.child(child_flow, n)
    fanned = ctx.all([ctx.defer_child(child_flow, i) for i in range(3)])
    try:
        ctx.child(failing_child_flow, n)
    except durable.ChildFailed as exc:
        caught = exc.code
    started = ctx.start_child(child_flow, 10, on_parent_close="abandon")  # runs on after the parent
    return {"first": first, "fanned": fanned, "caught": caught, "started": started}


@durable.workflow(name="tests.comp_counter")
def counter_flow(ctx, state):
    total = state["total"] + ctx.step(square, state["i"])
    if state["i"] < 3:
        ctx.continue_as_new({"i": state["i"] + 1, "total": total})
    return total


@durable.workflow(name="tests.comp_deadline", timeout="1h")
def deadline_flow(ctx, _):
    return ctx.wait_for_signal("never")


def test_map_runs_every_member_and_returns_outputs_in_order(durable_env):
    run = durable.start(map_flow, 5)
    durable_env.run_until_idle()
    assert durable.result(run.id) == [0, 1, 4, 9, 16]
    rows = Checkpoint.objects.filter(run_id=run.id).order_by("seq")
    assert [(r.seq, r.fan) for r in rows] == [(i, 0) for i in range(5)]


def test_fan_is_one_insert_and_resumes_the_run_once_when_closed(durable_env):
    run = durable.start(map_flow, 20)
    durable_env.run_next()  # the first turn: the whole fan at once
    sends = durable_env.pending()
    assert [m.task for m in sends] == ["durable.run_step"] * 20
    turns = 0
    while durable_env.pending():
        message = durable_env.run_next()
        turns += message.task == "durable.advance"
    # Members' results do not wake the run; only the last one does (the run's turn happens
    # inline on the worker that recorded it, so no advance message is needed at all).
    assert turns == 0
    assert Run.objects.get(id=run.id).wakes == 1
    assert durable.result(run.id) == [n * n for n in range(20)]


def test_a_result_before_the_fan_closes_touches_only_its_own_row(durable_env):
    run = durable.start(map_flow, 50)
    durable_env.run_next()
    message = durable_env.pending()[0]
    durable_env.drop()
    with CaptureQueriesContext(connection) as queries:
        from durable.engine import steps

        steps.run_step(*message.args)
    # Take the attempt, record it, ask whether the fan is closed: no fan-wide read.
    statements = [
        q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    assert len(statements) == 3, "\n".join(q[:90] for q in statements)
    assert Run.objects.get(id=run.id).wakes == 0


def test_all_raises_gather_error_at_the_first_failure(durable_env):
    run = durable.start(all_fails_flow, [1, 3])
    durable_env.run_until_idle()
    output = durable.result(run.id)
    assert output["code"] == "bad_item"
    assert output["errors"][0] == {"n": 1}


def test_all_settled_reports_each_member(durable_env):
    run = durable.start(settled_flow, [1])
    durable_env.run_until_idle()
    assert durable.result(run.id) == [[True, 0, None], [False, None, "bad_item"], [True, 2, None]]


def test_children_run_and_report_to_their_parent(durable_env):
    run = durable.start(parent_flow, 2)
    durable_env.run_until_idle()
    output = durable.result(run.id)
    assert output["first"] == 5
    assert output["fanned"] == [1, 2, 5]
    assert output["caught"] == "child_code"
    started = durable.get_run(output["started"])
    assert (started.parent_id, started.status, started.output) == (run.id, "completed", 101)
    assert Run.objects.filter(parent_id=run.id).count() == 6


def test_child_ids_are_stable_so_a_replayed_turn_starts_nothing_twice(durable_env):
    run = durable.start(parent_flow, 2)
    durable_env.run_until_idle()
    kids = set(Run.objects.filter(parent_id=run.id).values_list("id", flat=True))
    from durable.replay.composition import child_run_id

    assert child_run_id(run.id, 0) in kids
    assert len(kids) == 6


def test_delete_run_deletes_the_child_subtree(durable_env):
    run = durable.start(parent_flow, 2)
    durable_env.run_until_idle()
    assert durable.delete_run(run.id) == 7
    assert not Run.objects.exists()


def test_continue_as_new_chains_runs_and_result_follows_the_chain(durable_env):
    run = durable.start(counter_flow, {"i": 0, "total": 0})
    durable_env.run_until_idle()
    assert durable.result(run.id) == 0 + 1 + 4 + 9
    chain = [durable.get_run(run.id)]
    while (nxt := Run.objects.filter(continued_from=chain[-1]).first()) is not None:
        chain.append(nxt)
    assert len(chain) == 4
    assert [r.status for r in chain] == ["completed"] * 4
    assert chain[0].output == {"continued_as": chain[1].id}
    assert all(len(Checkpoint.objects.filter(run=r)) == 1 for r in chain)  # history stays short


@durable.workflow(name="tests.comp_continue_then_wait")
def continue_then_wait(ctx, generation):
    if generation == 0:
        ctx.continue_as_new(1)
    update = ctx.wait_for_update("deposit")
    ctx.reply(update, update.payload * 10)
    return [ctx.wait_for_signal("go"), update.payload]


def test_messages_sent_before_a_run_continues_as_new_wait_for_its_successor(durable_env):
    """A signal and an update the run had not taken when it continued as new (sent before its
    turn ran) go on to the newest run of the chain, and the update's reply follows them there."""
    run = durable.start(continue_then_wait, 0)
    durable.signal(run.id, "go", "ready", idempotency_key="go-1")
    durable.update(run.id, "deposit", 4, idempotency_key="deposit-1")
    durable_env.run_until_idle()
    assert durable.result(run.id) == ["ready", 4]
    successor = Run.objects.get(continued_from_id=run.id)
    assert set(Signal.objects.values_list("run_id", flat=True)) == {successor.id}
    # A sender trying again under its key finds its message where it went: nothing new is sent,
    # and the update answers with its reply.
    assert durable.update(run.id, "deposit", 4, idempotency_key="deposit-1", wait="1s") == 40
    durable.signal(run.id, "go", "ready", idempotency_key="go-1")
    assert Signal.objects.count() == 2


def test_workflow_timeout_fails_the_run_at_its_deadline(durable_env):
    run = durable.start(deadline_flow)
    durable_env.run_until_idle()
    durable_env.advance_time("59m")
    assert durable.get_run(run.id).status == "suspended"
    durable_env.advance_time("1m")
    record = durable.get_run(run.id)
    assert (record.status, record.error["code"], record.error["type"]) == (
        "failed",
        "timeout",
        "WorkflowTimeout",
    )


def test_defer_takes_only_steps(durable_env):
    @durable.workflow(name="tests.comp_bad_gather")
    def flow(ctx, _):
        return ctx.all([square])

    run = durable.start(flow)
    durable_env.run_until_idle()
    assert "takes what ctx.defer() returns" in durable.get_run(run.id).error["message"]


@durable.workflow(name="tests.comp_waiting_child")
def waiting_child_flow(ctx, _):
    return ctx.wait_for_signal("go")


@durable.workflow(name="tests.comp_waiting_parent")
def waiting_parent_flow(ctx, _):
    return ctx.child(waiting_child_flow, None)


@durable.workflow(name="tests.comp_grandparent")
def grandparent_flow(ctx, _):
    return ctx.child(waiting_parent_flow, None)


def test_cancelling_a_parent_cancels_its_running_children(durable_env):
    run = durable.start(grandparent_flow)
    durable_env.run_until_idle()
    tree = list(Run.objects.exclude(id=run.id))
    assert len(tree) == 2 and all(r.status == "suspended" for r in tree)
    assert durable.cancel(run.id, reason="order withdrawn") is True
    durable_env.run_until_idle()
    statuses = {r.id: (r.status, r.error["code"]) for r in Run.objects.all()}
    assert set(statuses.values()) == {("cancelled", "cancelled")}


@durable.workflow(name="tests.comp_failure_handler")
def failure_handler(ctx, failure):
    return {"failed_run": failure["run_id"], "code": failure["error"]["code"]}


@durable.workflow(name="tests.comp_other_handler")
def other_handler(ctx, failure):
    return "other"


@durable.workflow(name="tests.comp_routed", on_error={"declined": failure_handler, "*": other_handler})
def routed_flow(ctx, code):
    raise durable.ApplicationError("no", code=code)


def test_on_error_routes_by_code_once(durable_env):
    declined = durable.start(routed_flow, "declined")
    other = durable.start(routed_flow, "anything")
    durable_env.run_until_idle()
    assert durable.result(f"on_error:{declined.id}") == {"failed_run": declined.id, "code": "declined"}
    assert durable.result(f"on_error:{other.id}") == "other"
    durable.retry(declined.id)
    durable_env.run_until_idle()
    assert Run.objects.filter(id__startswith="on_error:").count() == 2  # a second failure routes nothing new


FLAKY_CHILD = {"fail": True}


@durable.workflow(name="tests.comp_flaky_child")
def flaky_child_flow(ctx, _):
    if FLAKY_CHILD["fail"]:
        raise durable.ApplicationError("not yet", code="not_yet")
    return "child ok"


@durable.workflow(name="tests.comp_retry_parent")
def retry_parent_flow(ctx, _):
    return ctx.child(flaky_child_flow)


def test_retrying_a_parent_retries_the_child_that_ended_it(durable_env):
    FLAKY_CHILD["fail"] = True
    run = durable.start(retry_parent_flow)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).error["code"] == "not_yet"
    FLAKY_CHILD["fail"] = False
    durable.retry(run.id)
    durable_env.run_until_idle()
    assert durable.result(run.id) == "child ok"
    assert Run.objects.filter(parent_id=run.id).count() == 1  # the same child, run again
