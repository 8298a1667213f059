"""Lanes: one fleet-wide admission line shared by several steps of several workflows. Their
attempts hold the lane's slots (per the lane's key), wait in its one line oldest first, and count
in its one rate window; a step's own limits are another gate."""

from __future__ import annotations

import pytest

import durable
from durable.limits import declared_lanes
from durable.models import Checkpoint, FlowGate
from durable_admin.lanes import lane_figures

pytestmark = pytest.mark.django_db

STARTED: list[str] = []
TOKENS: dict[str, str] = {}

GPU = durable.Lane("tests.gpu", concurrency=2)
PER_TENANT = durable.Lane("tests.tenants", concurrency=1, per_key="{tenant}")
OUTBOUND = durable.Lane("tests.outbound", rate_limit="2/s")


@pytest.fixture(autouse=True)
def _clear():
    STARTED.clear()
    TOKENS.clear()


def _held(name: str) -> None:
    STARTED.append(name)
    TOKENS[name] = durable.step_info().token
    raise durable.CompleteLater()


@durable.step(name="tests.lanes.embed", lane=GPU)
def embed(name):
    _held(f"embed:{name}")


@durable.step(name="tests.lanes.caption", lane=GPU)
def caption(name):
    _held(f"caption:{name}")


@durable.step(name="tests.lanes.bill", lane=PER_TENANT)
def bill(tenant, amount):
    _held(f"bill:{tenant}:{amount}")


@durable.step(name="tests.lanes.refund", lane=PER_TENANT)
def refund(tenant, amount):
    _held(f"refund:{tenant}:{amount}")


@durable.step(name="tests.lanes.mail", lane=OUTBOUND)
def mail(name):
    STARTED.append(f"mail:{name}")
    return name


@durable.step(name="tests.lanes.sms", lane=OUTBOUND)
def sms(name):
    STARTED.append(f"sms:{name}")
    return name


@durable.workflow(name="tests.lanes.embeddings")
def embeddings(ctx, names):
    return ctx.map(embed, names)


@durable.workflow(name="tests.lanes.captions")
def captions(ctx, names):
    return ctx.map(caption, names)


@durable.workflow(name="tests.lanes.money")
def money(ctx, calls):
    return ctx.all([ctx.defer(bill if op == "bill" else refund, tenant, n) for op, tenant, n in calls])


@durable.workflow(name="tests.lanes.notify")
def notify(ctx, names):
    return ctx.all([ctx.defer(mail if n % 2 else sms, n) for n in names])


def _finish(name):
    durable.complete_step(TOKENS.pop(name), name)


def test_two_workflows_share_a_lanes_slots_and_its_one_line(durable_env):
    first = durable.start(embeddings, ["a", "b"])
    durable_env.run_until_idle()
    second = durable.start(captions, ["c", "d"])
    durable_env.run_until_idle()
    assert STARTED == ["embed:a", "embed:b"]  # the lane's two slots, whoever asked
    assert FlowGate.objects.get(key="c:lane:tests.gpu:").waiting == 2
    _finish("embed:a")
    durable_env.run_until_idle()
    assert STARTED == ["embed:a", "embed:b", "caption:c"]  # the freed slot went across workflows
    for name in ("embed:b", "caption:c"):
        _finish(name)
        durable_env.run_until_idle()
    assert STARTED[-1] == "caption:d" and len(TOKENS) == 1
    _finish("caption:d")
    durable_env.run_until_idle()
    assert durable.result(first.id) == ["embed:a", "embed:b"]
    assert durable.result(second.id) == ["caption:c", "caption:d"]


def test_a_lane_per_key_holds_each_key_apart_across_its_steps(durable_env):
    run = durable.start(money, [["bill", "acme", 1], ["refund", "acme", 2], ["bill", "zeta", 3]])
    durable_env.run_until_idle()
    assert STARTED == ["bill:acme:1", "bill:zeta:3"]  # acme's refund waits for acme's bill
    flows = {r.seq: (r.flow, r.flow_key) for r in Checkpoint.objects.filter(run_id=run.id, kind="step")}
    assert flows[1] == ("waiting", "c:lane:tests.tenants:acme")
    _finish("bill:acme:1")
    durable_env.run_until_idle()
    assert STARTED == ["bill:acme:1", "bill:zeta:3", "refund:acme:2"]
    for name in ("bill:zeta:3", "refund:acme:2"):
        _finish(name)
    durable_env.run_until_idle()
    assert durable.get_run(run.id).status == "completed"


def test_a_lanes_rate_is_one_window_for_all_its_steps(durable_env):
    run = durable.start(notify, [1, 2, 3, 4])
    durable_env.run_until_idle()
    assert len(STARTED) == 2  # two of the four, mail or sms: the lane's 2/s
    durable_env.advance_time("1.2s")
    assert len(STARTED) == 4
    assert durable.result(run.id) == [1, 2, 3, 4]


def test_a_lane_is_declared_once(durable_env):
    durable.Lane("tests.gpu", concurrency=2)  # the same limits again: the same lane
    with pytest.raises(durable.InvalidInput, match="declared twice with different limits"):

        @durable.step(name="tests.lanes.other", lane=durable.Lane("tests.gpu", concurrency=3))
        def other():
            pass


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: durable.Lane(""), "must be a non-empty string"),
        (lambda: durable.Lane("x"), "limits nothing"),
        (lambda: durable.Lane("x", concurrency=0), "at least 1"),
        (lambda: durable.Lane("x", rate_limit="often"), '"<count>/<s|m|h>"'),
        (lambda: durable.Lane("x", concurrency=1, per_key=""), "Concurrency(key=...)"),
        (lambda: durable.step(lane="gpu")(lambda: None), "takes a durable.Lane"),
        (lambda: durable.step(lane=GPU, concurrency=1)(lambda: None), "not both"),
        (lambda: durable.step(lane=GPU, local=True)(lambda: None), "local=True"),
        (lambda: durable.step(lane=GPU, remote=True, queue="far")(lambda: None), "lane="),
    ],
)
def test_bad_lanes_are_refused_at_declaration(make, message):
    with pytest.raises(durable.InvalidInput) as raised:
        make()
    assert message in str(raised.value)


def test_a_refused_declaration_claims_no_lane():
    fresh = durable.Lane("tests.lanes.unclaimed", concurrency=1)
    with pytest.raises(durable.InvalidInput, match="local=True"):
        durable.step(name="tests.lanes.refused", lane=fresh, local=True)(lambda: None)
    assert all(lane.name != fresh.name for lane, _ in declared_lanes())
    # Nothing holds it yet: runs may have it.
    durable.workflow(name="tests.lanes.claims_it", lane=fresh)(lambda ctx, x: x)
    assert (fresh, "runs") in declared_lanes()


def test_the_health_page_counts_a_lanes_slots_waiters_and_starts(durable_env):
    durable.start(embeddings, ["a", "b"])
    durable.start(captions, ["c"])
    durable.start(notify, [1, 2, 3])
    durable_env.run_until_idle()

    figures = {row["lane"].name: row for row in lane_figures("default", durable_env.now())}

    gpu, outbound = figures["tests.gpu"], figures["tests.outbound"]
    assert (gpu["held"], gpu["waiting"], gpu["keys"], gpu["started"]) == (2, 1, 1, None)
    assert (outbound["held"], outbound["started"]) == (None, 2)


# -- runs in a lane ---------------------------------------------------------------------------

EXPORTS = durable.Lane("tests.exports", concurrency=1)
IMPORTS = durable.Lane("tests.imports", concurrency=1, per_key="{tenant}")


@durable.workflow(name="tests.lanes.export_report", lane=EXPORTS)
def export_report(ctx, name):
    return name


@durable.workflow(name="tests.lanes.export_audit", lane=EXPORTS)
def export_audit(ctx, name):
    ctx.wait_for_signal("go")
    return name


@durable.workflow(name="tests.lanes.import_file", lane=IMPORTS)
def import_file(ctx, job):
    ctx.wait_for_signal("go")
    return job["file"]


@durable.workflow(name="tests.lanes.plain")
def plain(ctx, name):
    ctx.wait_for_signal("go")
    return name


def _statuses(*handles):
    return [durable.get_run(h.id).status for h in handles]


def test_two_workflows_share_a_lanes_slot_and_wait_by_priority_then_start_order(durable_env):
    holder = durable.start(export_audit, "holder")
    durable_env.run_until_idle()
    low = durable.start(export_audit, "low")  # each waiting run holds the slot until signalled
    high = durable.start(export_audit, "high", priority=5)
    mid = durable.start(export_report, "mid", priority=1)  # ends as soon as it is admitted
    also_low = durable.start(export_audit, "also low")
    durable_env.run_until_idle()
    assert _statuses(holder, low, high, mid, also_low) == ["suspended"] + ["pending"] * 4

    def go(run):
        durable.signal(run.id, "go")
        durable_env.run_until_idle()

    go(holder)  # the highest priority first, though it started after low
    assert _statuses(high, mid, low, also_low) == ["suspended", "pending", "pending", "pending"]
    go(high)  # then the next priority (it ends at once), then, of equal priorities, the older
    assert _statuses(mid, low, also_low) == ["completed", "suspended", "pending"]
    go(low)
    assert _statuses(low, also_low) == ["completed", "suspended"]
    go(also_low)
    assert _statuses(holder, high, also_low) == ["completed"] * 3


def test_a_lane_per_key_lines_up_runs_per_key_of_their_input(durable_env):
    a1 = durable.start(import_file, {"tenant": "a", "file": 1})
    a2 = durable.start(import_file, {"tenant": "a", "file": 2})
    b1 = durable.start(import_file, {"tenant": "b", "file": 3})
    durable_env.run_until_idle()
    assert _statuses(a1, a2, b1) == ["suspended", "pending", "suspended"]
    durable.signal(a1.id, "go")
    durable_env.run_until_idle()
    assert _statuses(a1, a2) == ["completed", "suspended"]


def test_start_puts_a_run_of_a_workflow_without_a_line_in_a_lane(durable_env):
    first = durable.start(plain, "first", lane=EXPORTS)
    second = durable.start(export_report, "second")
    free = durable.start(plain, "free")  # no lane: nothing to wait for
    durable_env.run_until_idle()
    assert _statuses(first, second, free) == ["suspended", "pending", "suspended"]
    durable.signal(first.id, "go")
    durable_env.run_until_idle()
    assert _statuses(first, second) == ["completed", "completed"]


def test_a_lanes_limit_is_kept_on_its_slot_for_processes_without_its_code(durable_env):
    durable.start(export_report, "x")
    from durable.models import SingletonSlot

    assert SingletonSlot.objects.get(key="lane:tests.exports:*").limit == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: durable.workflow(lane=durable.Lane("tests.rated_runs", rate_limit="1/s"))(
                lambda ctx, x: x
            ),
            "rate_limit=",
        ),
        (lambda: durable.workflow(lane=GPU)(lambda ctx, x: x), "holds steps already"),
        (lambda: durable.step(lane=EXPORTS)(lambda: None), "holds runs already"),
        (
            lambda: durable.workflow(lane=EXPORTS, concurrency=2)(lambda ctx, x: x),
            "one of singleton=, concurrency= and lane=",
        ),
        (
            lambda: durable.start(export_report, 1, lane=durable.Lane("tests.other_runs", concurrency=3)),
            "cannot move a run",
        ),
        (lambda: durable.start(plain, 1, priority=1.5), "priority must be a whole number"),
        (lambda: durable.start(plain, 1, priority=10**7), "priority must be a whole number"),
        (lambda: durable.Lane("a:b", concurrency=1), "without ':'"),
    ],
)
def test_bad_run_lanes_are_refused(durable_env, make, message):
    with pytest.raises(durable.InvalidInput) as raised:
        make()
    assert message in str(raised.value)
