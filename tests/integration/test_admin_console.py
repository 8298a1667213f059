"""The admin's run console through Django's test client: its bounded queries, its buttons behind
their permissions, its forms, and the run list's filters and search."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import durable
from durable import conf
from durable.models import Checkpoint, Run
from durable_admin import run_list, run_page
from tests import console_flows as flows

CHANGELIST = "admin:durable_run_changelist"
#: Queries the run page may take, whatever the size of the run (session, user, run, fans,
#: timeline, waits, signals, relatives, ...): a fan of 2,000 costs what a fan of 10 does.
RUN_PAGE_QUERIES = 16
BUTTONS = ("retry", "cancel", "compensate", "resume", "send", "fork")


@pytest.fixture(autouse=True)
def _reset() -> Any:
    flows.OUTAGE["on"] = False
    flows.UNDONE.clear()
    yield
    flows.OUTAGE["on"] = False


def change_url(run_id: str, **params: Any) -> str:
    url = reverse("admin:durable_run_change", args=[quote(run_id)])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def action_url(run_id: str, button: str) -> str:
    return reverse(f"admin:durable_run_{button}", args=[quote(run_id)])


def page_of(client: Client, run_id: str, **params: Any) -> str:
    response = client.get(change_url(run_id, **params))
    assert response.status_code == 200
    return response.content.decode()


def section(html: str, element_id: str) -> str:
    return html.split(f'id="{element_id}"', 1)[1].split("</table>", 1)[0]


def staff(client: Client, *codenames: str) -> User:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="durable", codename__in=("view_run", *codenames)
    )
    user.user_permissions.add(*perms)
    client.force_login(user)
    return user


def fan_run(durable_env: Any, width: int, settle: int) -> str:
    """A run fanned out over ``width`` steps, ``settle`` of which have finished (the rest of its
    messages are dropped, so the run stays where it is)."""
    durable_env.drop()
    run_id = durable.start(flows.fan_flow, width).id
    durable_env.run_next()  # the first turn records the fan and sends its members
    for _ in range(settle):
        durable_env.run_next()
    durable_env.drop()
    return run_id


def queries_for(client: Client, url: str) -> int:
    with CaptureQueriesContext(connections[conf.get().DATABASE]) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_a_wide_fan_is_one_summary_line_and_its_members_come_50_a_page(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = fan_run(durable_env, 2000, settle=30)

    html = page_of(admin_client, run_id)
    members = page_of(admin_client, run_id, fan=0, page=2)

    timeline = section(html, "timeline")
    assert "fan of 2000 steps" in timeline
    assert "30 completed" in timeline and "1970 pending" in timeline
    assert timeline.count("durable-position") == 0  # no member drawn one by one
    rows = re.findall(r'<td class="col-seq"><a [^>]*>(\d+)</a>', section(members, "fan-members"))
    assert rows == [str(seq) for seq in range(50, 100)]
    assert "page 2 of 40" in members
    assert "fan at position 0: 1970 of 2000 members still pending" in html


def test_the_run_page_takes_as_many_queries_for_a_fan_of_2000_as_for_a_fan_of_10(
    admin_client: Client, durable_env: Any
) -> None:
    narrow = fan_run(durable_env, 10, settle=3)
    wide = fan_run(durable_env, 2000, settle=3)
    admin_client.get(reverse("admin:index"))  # the session's first request writes more than any later one

    counts = {
        "narrow": queries_for(admin_client, change_url(narrow)),
        "wide": queries_for(admin_client, change_url(wide)),
        "wide, a page of members": queries_for(admin_client, change_url(wide, fan=0, page=7)),
    }

    assert counts["narrow"] == counts["wide"] <= RUN_PAGE_QUERIES, counts
    assert counts["wide, a page of members"] <= RUN_PAGE_QUERIES + 1, counts


def test_a_waiting_run_says_what_it_waits_for_and_lists_buffered_signals(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = durable.start(flows.approval_flow, {"id": 7}).id
    durable_env.run_until_idle()
    durable.signal(run_id, "later", {"note": "kept"})

    html = page_of(admin_client, run_id)

    assert "position 0: signal &#x27;approve&#x27;" in section(html, "waiting-for")
    buffered = section(html, "signals")
    assert "later" in buffered and "buffered: no wait has taken it yet" in buffered


def test_a_run_not_yet_taken_waits_for_a_worker_on_its_queue(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.approval_flow, 1).id

    waits = section(page_of(admin_client, run_id), "waiting-for")

    assert (
        f"a worker consuming queue &#x27;{durable.get_run(run_id).queue}&#x27; to take its next turn" in waits
    )


def test_a_debounced_run_says_when_it_starts_unless_another_call_comes(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = durable.debounce(flows.approval_flow, 1, key="order-9", period="1m").id
    start = durable.get_run(run_id).wake_at.isoformat(timespec="seconds")

    waits = section(page_of(admin_client, run_id), "waiting-for")

    assert f"its debounce key &#x27;order-9&#x27; to stay quiet: starts at {start}" in waits


def test_a_failed_run_shows_its_error_and_links_its_on_error_run_both_ways(
    admin_client: Client, durable_env: Any
) -> None:
    flows.OUTAGE["on"] = True
    run_id = durable.start(flows.routed_flow, 5).id
    durable_env.run_until_idle()
    handler = f"on_error:{run_id}"
    assert durable.get_run(handler).status == "completed"

    failed = page_of(admin_client, run_id)
    handling = page_of(admin_client, handler)

    assert "StepFailed" in section(failed, "run-error")
    assert "payment provider is down" in section(failed, "run-error")
    assert handler in section(failed, "now") and "On_error run" in section(failed, "now")
    assert run_id in section(handling, "now") and "Handles failure of" in section(handling, "now")


def test_a_staff_user_without_the_permissions_sees_no_button_and_a_forged_post_changes_nothing(
    client: Client, durable_env: Any
) -> None:
    staff(client)
    flows.OUTAGE["on"] = True
    failed = durable.start(flows.charge_flow, 5).id
    waiting = durable.start(flows.approval_flow, 1).id
    durable_env.run_until_idle()

    pages = page_of(client, failed) + page_of(client, waiting)
    refused = {
        button: client.post(
            action_url(run_id, button), {"name": "approve", "payload": '{"by": "x"}'}
        ).status_code
        for run_id, button in [
            (failed, "retry"),
            (waiting, "cancel"),
            (waiting, "compensate"),
            (waiting, "resume"),
            (waiting, "send"),
            (failed, "fork"),
        ]
    }

    assert 'id="steer"' not in pages and "Delete with its subtree" not in pages
    assert refused == dict.fromkeys(BUTTONS, 403)
    assert client.get(action_url(waiting, "send")).status_code == 403
    assert client.get(action_url(failed, "fork")).status_code == 403
    assert "fork" not in section(pages, "timeline") and Run.objects.count() == 2
    durable_env.run_until_idle()
    assert durable.get_run(failed).status == "failed"
    assert durable.get_run(waiting).status == "suspended"
    assert not Run.objects.get(pk=waiting).signals.exists()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("codename", "shown"),
    [
        ("retry_run", {"retry"}),
        ("cancel_run", {"cancel", "compensate"}),
        ("signal_run", {"send"}),
        ("fork_run", {"fork"}),
    ],
)
def test_each_permission_shows_its_own_buttons_only(
    client: Client, durable_env: Any, codename: str, shown: set[str]
) -> None:
    staff(client, codename)
    flows.OUTAGE["on"] = True
    failed = durable.start(flows.charge_flow, 5).id
    waiting = durable.start(flows.approval_flow, 1).id
    durable_env.run_until_idle()

    html = page_of(client, failed) + page_of(client, waiting)
    found = {button for button in BUTTONS if f'name="{button}"' in html}
    found |= {"send"} if 'id="send-link"' in html else set()
    found |= {"fork"} if 'id="fork-link"' in html else set()

    assert found == shown


def test_retry_button_reruns_a_failed_run_and_writes_history(admin_client: Client, durable_env: Any) -> None:
    flows.OUTAGE["on"] = True
    run_id = durable.start(flows.charge_flow, 5).id
    durable_env.run_until_idle()
    flows.OUTAGE["on"] = False

    response = admin_client.post(action_url(run_id, "retry"), follow=True)
    durable_env.run_until_idle()

    assert "Retried: the run goes on from where it stopped." in [str(m) for m in response.context["messages"]]
    assert durable.get_run(run_id).output == "charged 5"
    (entry,) = LogEntry.objects.all()
    assert (entry.object_id, entry.get_change_message()) == (
        run_id,
        "Retried: the run goes on from where it stopped.",
    )


def test_retry_button_on_a_completed_run_says_why_not(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.charge_flow, 5).id
    durable_env.run_until_idle()

    response = admin_client.post(action_url(run_id, "retry"), follow=True)

    (message,) = [str(m) for m in response.context["messages"]]
    assert message.startswith("Not retried:") and "completed" in message


def test_cancel_with_compensation_undoes_the_done_steps(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.saga_flow, "lamp").id
    durable_env.run_until_idle()

    admin_client.post(action_url(run_id, "compensate"), {"confirmed": "yes"})
    durable_env.run_until_idle()

    run = durable.get_run(run_id)
    assert (run.status, run.error["message"]) == ("cancelled", "cancelled in the admin by admin")
    assert flows.UNDONE == ["reservation-lamp"]


def test_resume_now_sends_a_turn_at_once(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.approval_flow, 1).id
    durable_env.run_until_idle()

    admin_client.post(action_url(run_id, "resume"))

    assert [m.args for m in durable_env.pending() if m.task == "durable.advance"] != []
    durable_env.run_until_idle()
    assert durable.get_run(run_id).status == "suspended"  # still waiting for its signal


def test_resume_now_sends_again_a_step_whose_message_was_lost(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.charge_flow, 3).id
    durable_env.run_next()  # the first turn sends the step
    assert len(durable_env.drop()) == 1  # and the broker loses its message

    response = admin_client.post(action_url(run_id, "resume"), follow=True)
    durable_env.run_until_idle()

    assert "1 step attempt never taken sent again" in response.content.decode()
    assert durable.result(run_id) == "charged 3"


def test_the_send_form_delivers_a_signal_and_the_run_finishes(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.approval_flow, 7).id
    durable_env.run_until_idle()

    form = admin_client.get(action_url(run_id, "send")).content.decode()
    response = admin_client.post(
        action_url(run_id, "send"), {"kind": "signal", "name": "approve", "payload": '{"by": "ann"}'}
    )
    durable_env.run_until_idle()

    assert 'value="approve"' in form  # the name the run waits for, filled in
    assert response.status_code == 302
    assert durable.get_run(run_id).output == {"order": 7, "approved_by": "ann"}


@pytest.mark.parametrize(
    ("kind", "payload", "said"),
    [
        ("signal", '{"by": ', "The payload is not JSON"),
        ("signal", "[" * 5000 + "]" * 5000, "nested deeper than 100 levels"),
        ("update", "1" * 5001, "store it as a string"),
        ("update", '{"by": ""}', "an approval names who approved it"),
    ],
)
def test_the_send_form_refuses_bad_json_and_what_the_validator_refuses_storing_nothing(
    admin_client: Client, durable_env: Any, kind: str, payload: str, said: str
) -> None:
    run_id = durable.start(flows.approval_flow, 7).id
    durable_env.run_until_idle()

    response = admin_client.post(
        action_url(run_id, "send"), {"kind": kind, "name": "approve", "payload": payload}
    )

    assert response.status_code == 200
    assert said in response.content.decode()
    assert not Run.objects.get(pk=run_id).signals.exists()


def test_an_update_sent_through_the_form_passes_the_validator(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.approval_flow, 7).id
    durable_env.run_until_idle()

    admin_client.post(
        action_url(run_id, "send"), {"kind": "update", "name": "approve", "payload": '{"by": "bo"}'}
    )
    durable_env.run_until_idle()

    assert durable.get_run(run_id).output == {"order": 7, "approved_by": "bo"}


def test_run_list_filters_by_workflow_and_version_and_searches_tags_and_attributes(
    admin_client: Client, durable_env: Any
) -> None:
    tagged = durable.start(flows.charge_flow, 1, tags=["vip"]).id
    attributed = durable.start(
        flows.charge_flow, 2, search_attributes={"customer": "c-42", "contains": 3, "vip": True}
    ).id
    other = durable.start(flows.approval_flow, 3).id

    def listed(**params: str) -> set[str]:
        response = admin_client.get(reverse(CHANGELIST), params)
        assert response.status_code == 200
        return {run.id for run in response.context["cl"].result_list}

    assert listed(workflow="tests.console_charge_flow") == {tagged, attributed}
    assert listed(workflow="tests.console_approval", version=durable.get_run(other).version) == {other}
    assert listed(q="vip") == {tagged}
    assert listed(q="customer=c-42") == {attributed}
    assert listed(q="contains=3") == listed(q="vip=true") == {attributed}
    assert listed(q="customer=c-43") == set()
    assert listed(q=other) == listed(q=other[-8:]) == {other}
    facets = admin_client.get(reverse(CHANGELIST), {"_facets": "True"}).content.decode()
    assert re.search(r"tests\.console_charge_flow\s*\(2\)", facets)


def test_the_run_list_counts_at_most_a_bounded_number_of_runs(
    admin_client: Client, durable_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_list, "COUNT_LIMIT", 3)
    for n in range(5):
        durable.start(flows.charge_flow, n)

    response = admin_client.get(reverse(CHANGELIST))

    assert response.context["cl"].result_count == 4  # the limit and one more
    assert "more than 3 runs" in response.content.decode()


def test_the_timeline_pages_a_long_history(
    admin_client: Client, durable_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_page, "TIMELINE_PAGE", 2)
    monkeypatch.setattr(run_page, "NARROW_FAN", 10)  # a fan of 5 is drawn member by member
    run_id = fan_run(durable_env, 5, settle=5)

    first = section(page_of(admin_client, run_id), "timeline")
    later = page_of(admin_client, run_id, **{"from": 2})

    assert re.findall(r'<td class="col-seq"><a [^>]*>(\d+)</a>', first) == ["0", "1"]
    assert re.findall(r'<td class="col-seq"><a [^>]*>(\d+)</a>', section(later, "timeline")) == ["2", "3"]
    assert "?from=4" in later
    assert Checkpoint.objects.filter(run_id=run_id).count() == 5


def test_the_run_list_reads_no_distinct_and_counts_no_unbounded_set_of_runs(
    admin_client: Client, durable_env: Any
) -> None:
    for n in range(3):
        durable.start(flows.charge_flow, n)
    admin_client.get(reverse("admin:index"))

    with CaptureQueriesContext(connections[conf.get().DATABASE]) as captured:
        page = admin_client.get(reverse(CHANGELIST)).content.decode()
    runs = [q["sql"] for q in captured if "durable_run" in q["sql"]]

    assert not [sql for sql in runs if "DISTINCT" in sql.upper()], runs
    assert all("LIMIT" in sql.upper() for sql in runs if "COUNT(" in sql.upper()), runs
    year = durable_env.now().year
    assert f"created_at__year={year}" in page or "created_at__month=" in page or "created_at__day=" in page


def test_delete_with_subtree_names_the_runs_counts_their_rows_and_deletes_them_all(
    admin_client: Client, durable_env: Any
) -> None:
    from tests.integration.test_admin import admin_parent

    parent = durable.start(admin_parent, 1).id
    durable_env.run_until_idle()
    (child,) = Run.objects.filter(parent_id=parent).values_list("id", flat=True)
    url = reverse("admin:durable_run_delete", args=[quote(parent)])

    confirm = admin_client.get(url).content.decode()
    admin_client.post(url, {"post": "yes"})

    assert parent in confirm and child in confirm
    assert re.search(r"Runs:\s*2", confirm) and re.search(r"Checkpoints:\s*2", confirm), confirm
    assert not Run.objects.filter(id__in=[parent, child]).exists()


def test_a_failed_run_shows_the_traceback_of_its_failed_attempt_in_the_timeline_and_its_error(
    admin_client: Client, durable_env: Any
) -> None:
    flows.OUTAGE["on"] = True
    run_id = durable.start(flows.charge_flow, 5).id
    durable_env.run_until_idle()
    assert durable.get_run(run_id).status == "failed"

    page = page_of(admin_client, run_id)

    assert "Traceback of the last failed attempt (position 0, tests.console_charge)" in section(
        page, "run-error"
    )
    assert "ConnectionError: payment provider is down" in section(page, "run-error")
    assert "ConnectionError: payment provider is down" in section(page, "timeline").split("traceback", 1)[1]


@pytest.mark.parametrize("button", ["cancel", "compensate"])
def test_cancel_asks_first_and_acts_only_once_confirmed(
    admin_client: Client, durable_env: Any, button: str
) -> None:
    run_id = durable.start(flows.saga_flow, "lamp").id
    durable_env.run_until_idle()

    asked = admin_client.post(action_url(run_id, button))
    durable_env.run_until_idle()
    still = durable.get_run(run_id).status
    logged = LogEntry.objects.exists()
    done = admin_client.post(action_url(run_id, button), {"confirmed": "yes"}, follow=True)
    durable_env.run_until_idle()

    html = asked.content.decode()
    assert asked.status_code == 200 and still == "suspended"
    assert 'name="confirmed" value="yes"' in html and 'id="keep-running"' in html
    assert ("compensations" in html) == (button == "compensate")
    assert not logged
    assert done.redirect_chain and durable.get_run(run_id).status == "cancelled"
    undone = ["reservation-lamp"] if button == "compensate" else []
    assert undone == flows.UNDONE


def test_a_finished_run_shows_no_position_as_pending_until(admin_client: Client, durable_env: Any) -> None:
    run_id = durable.start(flows.deadline_flow, 1).id
    durable_env.run_until_idle()
    waiting = section(page_of(admin_client, run_id), "timeline")
    durable.cancel(run_id)
    durable_env.run_until_idle()

    ended = section(page_of(admin_client, run_id), "timeline")

    assert "<small>until " in waiting
    assert Checkpoint.objects.get(run_id=run_id, kind="signal").status == "pending"
    assert "until" not in ended and "never settled: the run ended" in ended


def test_a_waiting_runs_sweep_time_is_a_safety_net_not_a_second_timer(
    admin_client: Client, durable_env: Any
) -> None:
    run_id = durable.start(flows.deadline_flow, 1).id
    durable_env.run_until_idle()

    html = page_of(admin_client, run_id)

    assert "Wake at" not in html and "wake at" not in html
    assert "Safety-net check at" in html and "what it waits for is under Now" in html
    assert "(until " in section(html, "waiting-for")
    durable.signal(run_id, "approve", 1)
    durable_env.run_until_idle()
    assert "what it waits for is under Now" not in page_of(admin_client, run_id)


def test_failed_attempts_are_numbered_per_retry_round(admin_client: Client, durable_env: Any) -> None:
    flows.OUTAGE["on"] = True
    run_id = durable.start(flows.charge_twice_flow, 5).id
    durable_env.run_until_idle()
    durable_env.advance_time("2s")
    durable_env.run_until_idle()
    assert durable.get_run(run_id).status == "failed"
    durable.retry(run_id)
    durable_env.run_until_idle()

    failures = section(page_of(admin_client, run_id), "fieldset-0-1-heading")

    rows = re.findall(r"<tr><td>#0 tests.console_charge_twice</td><td>([^<]*)</td><td>(\d+)</td>", failures)
    assert rows == [("first", "1"), ("first", "2"), ("after retry 1", "1")]


def test_the_fork_form_forks_a_failed_run_at_its_failed_position_and_links_both_ways(
    client: Client, durable_env: Any
) -> None:
    staff(client, "fork_run")
    flows.OUTAGE["on"] = True
    failed = durable.start(flows.charge_flow, 5).id
    durable_env.run_until_idle()
    flows.OUTAGE["on"] = False

    page = page_of(client, failed)
    form = client.get(action_url(failed, "fork")).content.decode()
    response = client.post(action_url(failed, "fork"), {"at": "0", "run_id": "charge-5-again"})
    durable_env.run_until_idle()

    assert f'href="{action_url(failed, "fork")}?at=0"' in section(page, "timeline")  # "fork" per position
    assert '<option value="0" selected>0: step' in form  # the failed position, suggested
    assert response.status_code == 302 and response["Location"] == change_url("charge-5-again")
    assert durable.result("charge-5-again") == "charged 5"
    fork_page, origin_page = page_of(client, "charge-5-again"), page_of(client, failed)
    assert "Forked at position 0 from" in fork_page and failed in fork_page
    assert "Fork at position 0" in origin_page and "charge-5-again" in origin_page
    assert LogEntry.objects.get().change_message == "Forked at position 0: run charge-5-again."


def test_the_fork_form_refuses_a_taken_id_saying_so_and_forks_nothing(
    client: Client, durable_env: Any
) -> None:
    staff(client, "fork_run")
    flows.OUTAGE["on"] = True
    failed = durable.start(flows.charge_flow, 5).id
    other = durable.start(flows.approval_flow, 1).id
    durable_env.run_until_idle()

    response = client.post(action_url(failed, "fork"), {"at": "0", "run_id": other})

    assert response.status_code == 200
    assert "is taken" in response.content.decode()
    assert Run.objects.count() == 2
