"""The admin console in a real headless Chromium: log in, filter, read a wide fan, press the
buttons, send a signal through the form, pause a schedule; a user without the permissions sees no
button and a POST forged from the page changes nothing. Each page it looks at is saved as a PNG."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.db.backends import utils as db_utils
from django.urls import reverse

import durable
from durable.models import CronSchedule
from tests import console_flows as flows

from .conftest import SCREENSHOTS, Page

#: Queries the live server may make to draw a run page, whatever the width of its fans: 16 for
#: the console, 3 for what keeps it stuck and its failed attempts (pending positions, workers
#: seen, failed attempts).
RUN_PAGE_QUERIES = 16 + 3
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    flows.OUTAGE["on"] = False
    flows.UNDONE.clear()
    yield
    flows.OUTAGE["on"] = False


@pytest.fixture
def operator(transactional_db: Any) -> User:
    return User.objects.create_superuser("operator", "op@example.com", PASSWORD)


@pytest.fixture
def viewer(transactional_db: Any) -> User:
    user = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="durable", codename__in=("view_run",))
    )
    return user


def run_url(run_id: str, query: str = "") -> str:
    return reverse("admin:durable_run_change", args=[quote(run_id)]) + query


@contextmanager
def counted_queries() -> Iterator[list[str]]:
    """Every SQL statement any thread runs inside the block (the live server's included)."""
    seen: list[str] = []
    lock = threading.Lock()
    original = db_utils.CursorWrapper._execute

    def execute(self: Any, sql: str, *args: Any) -> Any:
        with lock:
            seen.append(sql)
        return original(self, sql, *args)

    db_utils.CursorWrapper._execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        db_utils.CursorWrapper._execute = original  # type: ignore[method-assign]


def test_log_in_and_filter_runs_by_status_and_workflow(page: Page, engine: Any, operator: User) -> None:
    flows.OUTAGE["on"] = True
    failed = durable.start(flows.charge_flow, 500, tags=["vip"]).id
    engine.run_until_idle()
    flows.OUTAGE["on"] = False
    done = [durable.start(flows.charge_flow, n).id for n in (1, 2)]
    waiting = durable.start(flows.approval_flow, {"order": 7}).id
    engine.run_until_idle()

    page.log_in("operator", PASSWORD)
    page.open(reverse("admin:durable_run_changelist") + "?_facets=True")
    page.shot("run-list")
    listed = page.text("#result_list")
    page.click("#changelist-filter a[href*='status__exact=failed']")
    only_failed = page.text("#result_list")
    page.click("#changelist-filter a[href*='workflow=tests.console_approval']")
    nothing = page.text("#changelist")
    page.open(reverse("admin:durable_run_changelist") + "?q=vip")
    by_tag = page.text("#result_list")

    assert all(run_id in listed for run_id in [failed, *done, waiting])
    assert failed in only_failed and not any(run_id in only_failed for run_id in [*done, waiting])
    assert "0 runs" in nothing
    assert failed in by_tag and waiting not in by_tag


def test_a_run_with_a_2000_member_fan_shows_one_page_of_members_in_bounded_queries(
    page: Page, engine: Any, operator: User
) -> None:
    run_id = durable.start(flows.fan_flow, 2000).id
    engine.run_next()  # the first turn records the fan and sends its 2,000 members
    for _ in range(700):
        engine.run_next()
    engine.drop()
    page.log_in("operator", PASSWORD)

    with counted_queries() as queries:
        page.open(run_url(run_id))
    page.shot("run-with-wide-fan")
    summary = page.text("#fan-0")
    page.click("#fan-0 a")
    members = page.all("#fan-members tr.durable-position")
    page.shot("fan-members")
    first_page = [row.find_element("css selector", ".col-seq").text for row in members]
    page.click("#fan-members a.durable-next")
    second_page = [row.text.split()[0] for row in page.all("#fan-members tr.durable-position")]

    assert "fan of 2000 steps" in summary and "700 completed" in summary and "1300 pending" in summary
    assert not page.all("#timeline tr.durable-position")  # no member drawn in the timeline
    assert first_page == [str(seq) for seq in range(50)]
    assert second_page == [str(seq) for seq in range(50, 100)]
    assert len(queries) <= RUN_PAGE_QUERIES, queries


def test_retry_a_failed_run_from_its_page(page: Page, engine: Any, operator: User) -> None:
    flows.OUTAGE["on"] = True
    run_id = durable.start(flows.charge_flow, 500).id
    engine.run_until_idle()
    flows.OUTAGE["on"] = False
    page.log_in("operator", PASSWORD)

    page.open(run_url(run_id))
    error = page.text("#run-error")
    page.shot("failed-run")
    page.click("button[name=retry]")
    said = page.text(".messagelist")
    engine.run_until_idle()
    page.open(run_url(run_id))
    page.shot("retried-run")

    assert "payment provider is down" in error
    assert "Retried: the run goes on from where it stopped." in said
    assert durable.get_run(run_id).output == "charged 500"
    assert "completed" in page.text("#now")


def test_send_a_signal_through_the_form_and_see_the_run_finish(
    page: Page, engine: Any, operator: User
) -> None:
    run_id = durable.start(flows.approval_flow, {"order": 7}).id
    engine.run_until_idle()
    page.log_in("operator", PASSWORD)

    page.open(run_url(run_id))
    waits = page.text("#waiting-for")
    page.shot("waiting-run")
    page.click("#send-link")
    prefilled = page.find("#id_name").get_attribute("value")
    page.find("#id_payload").send_keys('{"by": ')
    page.click("input[name=_send]")
    refused = page.text(".errorlist")
    page.shot("send-form-refuses-bad-json")
    payload = page.find("#id_payload")
    payload.clear()
    payload.send_keys('{"by": "ann"}')
    page.click("input[name=_send]")
    said = page.text(".messagelist")
    engine.run_until_idle()
    page.open(run_url(run_id))
    page.shot("signalled-run")

    assert "signal 'approve'" in waits
    assert prefilled == "approve"
    assert "The payload is not JSON" in refused
    assert "Signal 'approve' sent" in said
    assert durable.get_run(run_id).output == {"order": {"order": 7}, "approved_by": "ann"}
    assert "completed" in page.text("#now")


def test_fork_a_failed_run_from_its_failed_position(page: Page, engine: Any, operator: User) -> None:
    flows.OUTAGE["on"] = True
    run_id = durable.start(flows.charge_flow, 300).id
    engine.run_until_idle()
    flows.OUTAGE["on"] = False
    page.log_in("operator", PASSWORD)

    page.open(run_url(run_id))
    page.shot("failed-run-with-fork")
    page.click(".durable-fork-here")
    chosen = page.find("#id_at option[selected]").text
    page.find("#id_run_id").send_keys("charge-300-fixed")
    page.shot("fork-form")
    page.click("input[name=_fork]")
    said = page.text(".messagelist")
    engine.run_until_idle()
    page.open(run_url("charge-300-fixed"))
    page.shot("forked-run")
    relatives = page.text("#now")

    assert chosen.startswith("0: step tests.console_charge (failed)")
    assert "Forked at position 0: run charge-300-fixed." in said
    assert durable.get_run("charge-300-fixed").output == "charged 300"
    assert "Forked at position 0 from" in relatives and run_id in relatives
    assert durable.get_run(run_id).status == "failed"


def test_cancel_with_compensation_undoes_the_done_steps(page: Page, engine: Any, operator: User) -> None:
    run_id = durable.start(flows.saga_flow, "lamp").id
    engine.run_until_idle()
    page.log_in("operator", PASSWORD)

    page.open(run_url(run_id))
    page.click("button[name=compensate]")
    asked = page.text("#content")
    page.shot("asked-to-confirm")
    engine.run_until_idle()
    untouched = durable.get_run(run_id).status
    page.click("input[name=confirm]")
    said = page.text(".messagelist")
    engine.run_until_idle()
    page.open(run_url(run_id))
    page.shot("compensated-run")

    assert "runs the compensations of the steps it finished" in asked and untouched == "suspended"
    assert "Cancel with compensation requested" in said
    assert durable.get_run(run_id).status == "cancelled"
    assert flows.UNDONE == ["reservation-lamp"]
    assert "compensation" in page.text("#timeline")


def test_a_waiting_run_reads_one_time_and_once_cancelled_waits_for_nothing(
    page: Page, engine: Any, operator: User
) -> None:
    run_id = durable.start(flows.deadline_flow, 1).id
    engine.run_until_idle()
    page.log_in("operator", PASSWORD)

    page.open(run_url(run_id))
    waits = page.text("#waiting-for")
    source = page.driver.page_source
    waiting_row = page.text("#timeline tbody tr")
    page.shot("waiting-run")
    page.click("button[name=cancel]")
    page.shot("asked-to-confirm")
    page.click("#keep-running")  # no: back to the run, nothing changed
    kept = durable.get_run(run_id).status
    page.click("button[name=cancel]")
    page.click("input[name=confirm]")
    said = page.text(".messagelist")
    engine.run_until_idle()
    page.open(run_url(run_id))
    ended_row = page.text("#timeline tbody tr")
    page.shot("cancelled-run")

    assert "signal 'approve' (until" in waits
    assert "Safety-net check at" in source and "Wake at" not in source
    assert "until" in waiting_row
    assert kept == "suspended"
    assert "Cancelled." in said and durable.get_run(run_id).status == "cancelled"
    assert "until" not in ended_row and "never settled: the run ended" in ended_row
    assert page.all("#waiting-for") == []


def test_cancel_selected_runs_asks_first(page: Page, engine: Any, operator: User) -> None:
    run_id = durable.start(flows.approval_flow, {"order": 8}).id
    engine.run_until_idle()
    page.log_in("operator", PASSWORD)

    page.open(reverse("admin:durable_run_changelist"))
    page.find(f"input.action-select[value='{run_id}']").click()
    page.find("select[name=action] option[value=cancel_runs]").click()
    page.click("button[name=index]")
    asked = page.text("#content")
    page.shot("asked-to-confirm")
    page.click("#keep-running")
    back = page.driver.current_url
    kept = durable.get_run(run_id).status
    page.find(f"input.action-select[value='{run_id}']").click()
    page.find("select[name=action] option[value=cancel_runs]").click()
    page.click("button[name=index]")
    page.click("input[name=confirm]")
    said = page.text(".messagelist")

    assert "Cancel 1 run?" in asked and run_id in asked
    assert back.endswith("/admin/durable/run/") and kept == "suspended"
    assert "Cancelled 1 run." in said and durable.get_run(run_id).status == "cancelled"


def test_pause_a_schedule_from_the_schedule_list(page: Page, engine: Any, operator: User) -> None:
    durable.schedule("nightly-report", flows.charge_flow, cron="0 3 * * *", input=1)
    page.log_in("operator", PASSWORD)

    page.open(reverse("admin:durable_cronschedule_changelist"))
    page.find("input.action-select[value='nightly-report']").click()
    page.find("select[name=action] option[value=pause]").click()
    page.click("button[name=index]")
    said = page.text(".messagelist")
    page.shot("paused-schedule")

    assert "Paused 1 schedule." in said
    assert CronSchedule.objects.get(key="nightly-report").paused is True


def test_a_staff_user_without_the_permissions_sees_no_button_and_a_forged_post_changes_nothing(
    page: Page, engine: Any, viewer: User
) -> None:
    flows.OUTAGE["on"] = True
    run_id = durable.start(flows.charge_flow, 5).id
    engine.run_until_idle()
    page.log_in("viewer", PASSWORD)

    page.open(run_url(run_id))
    buttons = page.all("#steer button, #steer a")
    page.shot("viewer-sees-no-buttons")
    # A form forged in the page, with the session's own CSRF token, posted to the retry URL.
    page.run_and_wait(
        """
        const form = document.createElement('form');
        form.method = 'post';
        form.action = arguments[0];
        form.appendChild(document.querySelector('[name=csrfmiddlewaretoken]').cloneNode());
        document.body.appendChild(form);
        form.submit();
        """,
        reverse("admin:durable_run_retry", args=[quote(run_id)]),
    )
    refused = page.text("body")
    engine.run_until_idle()

    assert buttons == []
    assert "403" in refused or "Forbidden" in refused
    assert durable.get_run(run_id).status == "failed"
    assert not engine.pending()


def test_the_health_page_names_a_queue_no_worker_consumes(page: Page, engine: Any, operator: User) -> None:
    engine.drop()
    stuck = durable.start(flows.charge_flow, 5).id  # its turn waits for a worker on ``durable``
    page.log_in("operator", PASSWORD)

    page.open(reverse("admin:durable_presence_changelist"))
    health = page.text("#content")
    page.shot("health")
    page.open(run_url(stuck))
    now = page.text("#now")
    page.shot("stuck-run")

    assert "no worker: start one with -Q durable" in health
    assert "Stuck: no worker has consumed queue 'durable' lately" in now


def test_the_health_page_shows_a_lanes_slots_held_and_attempts_waiting(
    page: Page, engine: Any, operator: User
) -> None:
    for n in range(3):
        durable.start(flows.render_flow, n)
    engine.run_until_idle()  # one render holds the lane's one slot, two wait in its line
    page.log_in("operator", PASSWORD)

    page.open(reverse("admin:durable_presence_changelist"))
    lanes = page.text("#lanes")
    page.shot("health-lanes")

    assert "tests.console_rendering steps 1 1 2 1 - -" in lanes


def test_the_run_list_shows_every_column_whole_at_1400_px(page: Page, engine: Any, operator: User) -> None:
    flows.OUTAGE["on"] = True
    durable.start(flows.charge_flow, 500, tags=["vip"])
    engine.run_until_idle()
    flows.OUTAGE["on"] = False
    durable.start(flows.approval_flow, {"order": 7}, run_id="a-run-id-as-long-as-a-uuid-4f1c2b7e9d3a")
    engine.run_until_idle()
    page.log_in("operator", PASSWORD)

    # As a first visit sees it: the admin's app list open beside the table.
    page.driver.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
    page.driver.set_window_size(1400, 1000)
    try:
        page.open(reverse("admin:durable_run_changelist"))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.driver.save_screenshot(str(SCREENSHOTS / f"{page.name}--run-list-1400.png"))
        clipped = page.driver.execute_script(
            """
            const box = document.querySelector('#changelist .results');
            const cells = [...document.querySelectorAll('#result_list th, #result_list td')];
            const cut = cells.filter(cell => cell.scrollWidth > cell.clientWidth + 1
                || cell.getBoundingClientRect().right > box.getBoundingClientRect().right + 0.5);
            return [...(box.scrollWidth > box.clientWidth ? ['the list scrolls sideways'] : []),
                    ...cut.map(cell => cell.className + ': ' + cell.textContent.trim())];
            """
        )
    finally:
        page.driver.set_window_size(1600, 1000)

    assert clipped == []
