"""The durable_admin pages and actions, driven through the admin with runs made by durable_env."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

import durable
from durable import Retry
from durable.models import Checkpoint, Run

#: Flipped by the ``outage`` fixture: while True, ``charge`` fails for good.
OUTAGE = {"on": False}


@durable.step
def add(a: int, b: int) -> int:
    return a + b


@durable.step(retry=Retry(max_attempts=3, initial="1s"))
def flaky_double(n: int) -> int:
    if durable.step_info().attempt == 1:
        raise ConnectionError("the first attempt always fails")
    return n * 2


@durable.step(retry=Retry(max_attempts=1))
def charge(n: int) -> str:
    if OUTAGE["on"]:
        raise ConnectionError("payment provider is down")
    return f"charged {n}"


@durable.workflow(name="tests.admin_add")
def add_flow(ctx: durable.Context, n: int) -> int:
    return ctx.step(add, n, 1)


@durable.workflow(name="tests.admin_history")
def history_flow(ctx: durable.Context, n: int) -> int:
    doubled = ctx.step(flaky_double, ctx.step(add, n, 1))
    return ctx.step(add, doubled, 0)


@durable.workflow(name="tests.admin_charge")
def charge_flow(ctx: durable.Context, n: int) -> str:
    return ctx.step(charge, n)


@durable.step(name="tests.admin_one_at_a_time", concurrency=durable.Concurrency(limit=1, key="{0}"))
def one_at_a_time(customer: str, n: int) -> None:
    raise durable.CompleteLater()


@durable.step(name="tests.admin_rated", rate_limit="1/h")
def rated(n: int) -> int:
    return n


@durable.workflow(name="tests.admin_limits")
def limits_flow(ctx: durable.Context, n: int) -> Any:
    ctx.all([ctx.defer(one_at_a_time, "ann", i) for i in range(n)] + [ctx.defer(rated, i) for i in range(n)])


@durable.workflow(name="tests.admin_wait")
def wait_flow(ctx: durable.Context, _: Any) -> Any:
    return ctx.wait_for_signal("go")


CHANGELIST = "admin:durable_run_changelist"


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    monkeypatch.setitem(OUTAGE, "on", True)
    return OUTAGE


def run_to_idle(durable_env: Any, workflow: str, n: int) -> str:
    """Start a run, run it until idle and return its id."""
    run_id = durable.start(workflow, n).id
    durable_env.run_until_idle()
    return run_id


def change_url(run_id: str) -> str:
    return reverse("admin:durable_run_change", args=[quote(run_id)])


def act(client: Client, action: str, run_ids: list[str], *, confirmed: bool = False) -> list[str]:
    """Post a changelist action on ``run_ids`` (answered yes to its confirmation page when
    ``confirmed``); return the messages the admin shows."""
    data = {"action": action, "_selected_action": run_ids, **({"post": "yes"} if confirmed else {})}
    response = client.post(reverse(CHANGELIST), data, follow=True)
    assert response.status_code == 200
    return [str(message) for message in response.context["messages"]]


def inline_rows(html: str) -> list[dict[str, str]]:
    """The cells of the run page's timeline rows, by column name."""
    section = html.split('id="timeline"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<tr class="durable-position[^"]*"[^>]*>(.*?)</tr>', section, re.S)
    cells = [re.findall(r'<td class="[^"]*col-(\w+)">(.*?)</td>', row, re.S) for row in rows]
    return [
        {name: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text)).strip() for name, text in row}
        for row in cells
    ]


def test_changelist_lists_runs_newest_first(admin_client: Client, durable_env: Any) -> None:
    older = run_to_idle(durable_env, "tests.admin_add", 1)
    durable_env.advance_time("1s")
    newer = run_to_idle(durable_env, "tests.admin_add", 2)

    response = admin_client.get(reverse(CHANGELIST))

    assert response.status_code == 200
    assert [run.id for run in response.context["cl"].result_list] == [newer, older]
    assert "tests.admin_add" in response.content.decode()


def test_changelist_filters_by_status(admin_client: Client, durable_env: Any, outage: Any) -> None:
    completed = run_to_idle(durable_env, "tests.admin_add", 1)
    failed = run_to_idle(durable_env, "tests.admin_charge", 1)

    only_failed = admin_client.get(reverse(CHANGELIST), {"status__exact": "failed"})
    only_completed = admin_client.get(reverse(CHANGELIST), {"status__exact": "completed"})

    assert [run.id for run in only_failed.context["cl"].result_list] == [failed]
    assert [run.id for run in only_completed.context["cl"].result_list] == [completed]


def test_changelist_searches_by_id_and_workflow(admin_client: Client, durable_env: Any) -> None:
    added = run_to_idle(durable_env, "tests.admin_add", 1)
    waiting = run_to_idle(durable_env, "tests.admin_wait", 0)

    by_id = admin_client.get(reverse(CHANGELIST), {"q": waiting})
    by_workflow = admin_client.get(reverse(CHANGELIST), {"q": "admin_add"})

    assert [run.id for run in by_id.context["cl"].result_list] == [waiting]
    assert [run.id for run in by_workflow.context["cl"].result_list] == [added]


def test_change_page_shows_checkpoints_in_seq_order_with_status_and_attempts(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = run_to_idle(durable_env, "tests.admin_history", 4)
    durable_env.advance_time("2s")  # past the backoff of flaky_double's first attempt
    assert durable.get_run(run_id).status == "completed"

    response = admin_client.get(change_url(run_id))

    assert response.status_code == 200
    rows = inline_rows(response.content.decode())
    assert [(r["seq"], r["position"], r["status"], r["attempt"]) for r in rows] == [
        ("0", f"step {add.name}", "completed", "1"),
        ("1", f"step {flaky_double.name}", "completed", "2"),
        ("2", f"step {add.name}", "completed", "1"),
    ]


def test_change_page_shows_steps_waiting_for_a_slot_or_a_rate_token_with_their_limit(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = run_to_idle(durable_env, "tests.admin_limits", 2)

    page = admin_client.get(change_url(run_id)).content.decode()

    assert "holds a slot (concurrency 1, key &#x27;ann&#x27;)" in page
    assert "waiting for a slot (concurrency 1, key &#x27;ann&#x27;), place 1 in line" in page
    assert "waiting for a rate token (rate_limit 1/h) until" in page
    checkpoint = Checkpoint.objects.get(run_id=run_id, seq=1)
    own_page = admin_client.get(reverse("admin:durable_checkpoint_change", args=[checkpoint.pk]))
    assert "waiting for a slot" in own_page.content.decode()


def test_change_page_shows_a_failed_steps_short_error(
    admin_client: Client, durable_env: Any, outage: Any
) -> None:
    run_id = run_to_idle(durable_env, "tests.admin_charge", 1)

    rows = inline_rows(admin_client.get(change_url(run_id)).content.decode())

    # The short error, then the attempt's kept traceback behind a disclosure.
    assert [(r["status"], r["error"].split("traceback", 1)[0]) for r in rows] == [
        ("failed", "ConnectionError: payment provider is down")
    ]
    assert rows[0]["error"].endswith("ConnectionError: payment provider is down")


def test_change_page_pretty_prints_json_and_lists_buffered_signals(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = durable.start("tests.admin_wait", {"order": {"id": 7}}, run_id="order:7/approval_1").id
    durable_env.run_until_idle()
    durable.signal(run_id, "later", {"note": "kept until a wait takes it"})

    html = admin_client.get(change_url(run_id)).content.decode()

    assert "{\n  &quot;order&quot;: {\n    &quot;id&quot;: 7\n  }\n}" in html
    assert "kept until a wait takes it" in html
    assert 'name="_save"' not in html  # view only: nothing to save


@durable.workflow(name="tests.admin_answers")
def answers_flow(ctx: durable.Context, _: Any) -> Any:
    ctx.expose("phase", "answering")
    update = ctx.wait_for_update("ask")
    ctx.reply(update, {"answer": "forty-two"})
    return ctx.wait_for_signal("done")


def test_change_page_shows_exposed_values_updates_and_their_replies(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = durable.start("tests.admin_answers").id
    durable.update(run_id, "ask", {"question": "life"}, idempotency_key="ask-1")
    durable_env.run_until_idle()

    html = admin_client.get(change_url(run_id)).content.decode()

    assert "&quot;phase&quot;: &quot;answering&quot;" in html
    assert "forty-two" in html and "ask-1" in html


def test_retry_action_runs_a_failed_run_again(admin_client: Client, durable_env: Any, outage: Any) -> None:
    failed = run_to_idle(durable_env, "tests.admin_charge", 5)
    completed = run_to_idle(durable_env, "tests.admin_add", 1)
    assert durable.get_run(failed).status == "failed"
    outage["on"] = False

    shown = act(admin_client, "retry_runs", [failed, completed])

    assert durable.get_run(failed).status == "pending"
    assert "Retried 1 run; it goes on from where it stopped." in shown
    assert any(m.startswith("Skipped 1 run that cannot be retried:") and "completed" in m for m in shown)
    durable_env.run_until_idle()
    run = durable.get_run(failed)
    assert (run.status, run.output) == ("completed", "charged 5")
    assert durable.get_run(completed).status == "completed"


def test_cancel_action_cancels_a_suspended_run_and_reports_finished_ones(
    admin_client: Client, durable_env: Any
) -> None:
    waiting = run_to_idle(durable_env, "tests.admin_wait", 0)
    completed = run_to_idle(durable_env, "tests.admin_add", 1)
    assert durable.get_run(waiting).status == "suspended"

    asked = admin_client.post(
        reverse(CHANGELIST), {"action": "cancel_runs", "_selected_action": [waiting, completed]}
    )
    html = asked.content.decode()
    assert "Cancel 2 runs?" in html and waiting in html and completed in html
    assert durable.get_run(waiting).status == "suspended"  # asking changed nothing

    shown = act(admin_client, "cancel_runs", [waiting, completed], confirmed=True)

    run = durable.get_run(waiting)
    assert run.status == "cancelled"
    assert run.error["message"] == "cancelled in the admin by admin"
    assert durable.get_run(completed).status == "completed"
    assert shown == ["Cancelled 1 run.", "1 run had already finished; left as it was."]


def test_delete_action_deletes_runs_with_their_history(admin_client: Client, durable_env: Any) -> None:
    run_id = run_to_idle(durable_env, "tests.admin_add", 1)

    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "_selected_action": [run_id], "post": "yes"},
        follow=True,
    )

    assert response.status_code == 200
    assert not Run.objects.filter(id=run_id).exists()
    assert not Checkpoint.objects.filter(run_id=run_id).exists()


def test_add_and_edit_are_denied(admin_client: Client, durable_env: Any) -> None:
    run_id = run_to_idle(durable_env, "tests.admin_add", 1)

    assert admin_client.get(reverse("admin:durable_run_add")).status_code == 403
    assert admin_client.get(reverse("admin:durable_checkpoint_add")).status_code == 403
    assert admin_client.post(change_url(run_id), {"workflow": "hijacked"}).status_code == 403
    assert durable.get_run(run_id).workflow == "tests.admin_add"


def test_actions_need_the_change_permission(client: Client, durable_env: Any) -> None:
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(codename="view_run", content_type__app_label="durable")
    )
    client.force_login(viewer)
    waiting = run_to_idle(durable_env, "tests.admin_wait", 0)

    response = client.get(reverse(CHANGELIST))
    client.post(reverse(CHANGELIST), {"action": "cancel_runs", "_selected_action": [waiting]})

    assert response.status_code == 200
    assert "cancel_runs" not in response.content.decode()
    assert durable.get_run(waiting).status == "suspended"


def test_checkpoint_changelist_filters_by_kind_and_run(admin_client: Client, durable_env: Any) -> None:
    waiting = run_to_idle(durable_env, "tests.admin_wait", 0)
    run_to_idle(durable_env, "tests.admin_add", 1)
    url = reverse("admin:durable_checkpoint_changelist")

    signals = admin_client.get(url, {"kind": "signal"})
    of_run = admin_client.get(url, {"run": waiting})

    assert [(c.run_id, c.kind) for c in signals.context["cl"].result_list] == [(waiting, "signal")]
    assert [c.run_id for c in of_run.context["cl"].result_list] == [waiting]


@durable.workflow(name="tests.admin_chain")
def admin_chain(ctx, n):
    if n < 1:
        ctx.continue_as_new(n + 1)
    return n


@durable.workflow(name="tests.admin_parent")
def admin_parent(ctx, n):
    return ctx.child(add_flow, n)


def test_change_page_links_a_continue_as_new_chain_both_ways_and_children(admin_client, durable_env):
    first = durable.start(admin_chain, 0)
    parent = durable.start(admin_parent, 1)
    durable_env.run_until_idle()
    second = Run.objects.get(continued_from_id=first.id)
    page = admin_client.get(reverse("admin:durable_run_change", args=[quote(first.id)])).content.decode()
    assert second.id in page
    back = admin_client.get(reverse("admin:durable_run_change", args=[quote(second.id)])).content.decode()
    assert first.id in back
    kids = admin_client.get(reverse("admin:durable_run_change", args=[quote(parent.id)])).content.decode()
    (child,) = Run.objects.filter(parent_id=parent.id).values_list("id", flat=True)
    assert child in kids.split('id="children"', 1)[1]
    child_page = admin_client.get(reverse("admin:durable_run_change", args=[quote(child)])).content.decode()
    assert parent.id in child_page.split('id="now"', 1)[1]
    listing = admin_client.get(reverse("admin:durable_run_changelist") + f"?parent={parent.id}")
    assert listing.status_code == 200


SCHEDULES = "admin:durable_cronschedule_changelist"


def test_schedules_are_listed_paused_resumed_and_triggered(admin_client: Client, durable_env: Any) -> None:
    from durable.models import CronSchedule

    durable.schedule("admin-report", add_flow, cron="0 * * * *", input=2)
    page = admin_client.get(reverse(SCHEDULES)).content.decode()
    assert "admin-report" in page and "0 * * * *" in page
    for action, paused in (("pause", True), ("resume", False)):
        admin_client.post(
            reverse(SCHEDULES), {"action": action, "_selected_action": ["admin-report"]}, follow=True
        )
        assert CronSchedule.objects.get(key="admin-report").paused is paused
    response = admin_client.post(
        reverse(SCHEDULES), {"action": "trigger", "_selected_action": ["admin-report"]}, follow=True
    )
    (run_id,) = Run.objects.filter(id__startswith="schedule:admin-report:").values_list("id", flat=True)
    assert run_id in response.content.decode()
    page = admin_client.get(
        reverse("admin:durable_cronschedule_change", args=["admin-report"])
    ).content.decode()
    assert "cron" in page


def test_published_events_are_listed(admin_client: Client, durable_env: Any) -> None:
    durable.publish_event("admin.paid", {"order": 7})
    page = admin_client.get(reverse("admin:durable_event_changelist")).content.decode()
    assert "admin.paid" in page


def test_trigger_of_a_schedule_whose_workflow_is_gone_shows_an_error(
    admin_client: Client, durable_env: Any
) -> None:
    from durable import clock
    from durable.models import CronSchedule

    durable.schedule("adds", add_flow, cron="0 * * * *", input=1)
    now = clock.now()
    CronSchedule.objects.create(
        key="gone",
        workflow="tests.admin_no_longer_here",
        cron="0 * * * *",
        next_at=now,
        created_at=now,
        updated_at=now,
    )
    response = admin_client.post(
        reverse("admin:durable_cronschedule_changelist"),
        {"action": "trigger", "_selected_action": ["adds", "gone"]},
        follow=True,
    )
    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    assert any(text.startswith("Started 1 run: schedule:adds:") for text in shown), shown
    assert any(
        "Could not start a run of 1 schedule: gone:" in text and "tests.admin_no_longer_here" in text
        for text in shown
    ), shown
    assert list(Run.objects.values_list("workflow", flat=True)) == ["tests.admin_add"]


@durable.entity("tests.admin_counter")
class AdminCounter:
    def initial_state(self) -> dict:
        return {"n": 0}

    def add(self, state: dict, k: int) -> int:
        if k < 0:
            raise ValueError("only up")
        state["n"] += k
        return state["n"]


def test_entities_are_listed_with_pending_ops_and_shown_with_state_and_recent_ops(
    admin_client: Client, durable_env: Any
) -> None:
    from durable.models import EntityOp

    durable.signal_entity("tests.admin_counter", "c1", "add", 5)
    durable.signal_entity("tests.admin_counter", "c1", "add", -1)
    durable_env.run_until_idle()
    durable.signal_entity("tests.admin_counter", "c1", "add", 2)  # pending
    page = admin_client.get(reverse("admin:durable_entity_changelist")).content.decode()
    assert "tests.admin_counter" in page and "c1" in page
    assert "status__exact=pending" in page  # the pending count links to the key's pending ops
    (entity_id,) = durable.models.Entity.objects.values_list("id", flat=True)
    page = admin_client.get(reverse("admin:durable_entity_change", args=[entity_id])).content.decode()
    assert "&quot;n&quot;: 5" in page
    assert "only up" in page and "applied" in page and "failed" in page
    ops = admin_client.get(
        reverse("admin:durable_entityop_changelist")
        + "?entity=tests.admin_counter&key=c1&status__exact=pending"
    )
    assert ops.status_code == 200
    assert ops.context["cl"].result_count == 1
    failed = EntityOp.objects.get(status="failed")
    page = admin_client.get(reverse("admin:durable_entityop_change", args=[failed.id])).content.decode()
    assert "ValueError" in page


def test_entity_ops_are_filtered_by_namespace(admin_client: Client, durable_env: Any) -> None:
    from django.test import override_settings

    with override_settings(DURABLE={"NAMESPACE": "tenant-a"}):
        durable.signal_entity("tests.admin_counter", "c1", "add", 1)
    durable.signal_entity("tests.admin_counter", "c1", "add", 2)
    ops = admin_client.get(reverse("admin:durable_entityop_changelist") + "?namespace=tenant-a")
    assert ops.status_code == 200
    assert [op.arg for op in ops.context["cl"].result_list] == [1]
    assert "By namespace" in ops.content.decode()  # offered in the filters, not only by URL


def test_cancel_selected_asks_first_for_every_run_the_filter_selects(
    admin_client: Client, durable_env: Any
) -> None:
    waiting = [run_to_idle(durable_env, "tests.admin_wait", 0) for _ in range(3)]
    url = reverse(CHANGELIST) + "?status__exact=suspended"
    selection = {"action": "cancel_runs", "select_across": "1", "_selected_action": waiting[:1]}

    asked = admin_client.post(url, selection).content.decode()
    assert "Cancel 3 runs?" in asked and 'name="select_across" value="1"' in asked
    assert 'href="/admin/durable/run/?status__exact=suspended" class="cancel-link"' in asked
    assert {durable.get_run(run_id).status for run_id in waiting} == {"suspended"}

    admin_client.post(url, {**selection, "post": "yes"})
    assert {durable.get_run(run_id).status for run_id in waiting} == {"cancelled"}
