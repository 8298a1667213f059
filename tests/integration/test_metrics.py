"""Metrics through durable_env: each instrument with its attributes after real runs, read through
an OpenTelemetry SDK in-memory reader and through durable.metrics_view; nothing counted for a
transition rolled back; the gauges read from the database; the view's protection."""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

import durable
from durable import clock, conf, metrics
from durable.metrics.instruments import INSTRUMENTS
from durable.models import Checkpoint, Run
from tests.metrics_readings import otel_points, prometheus_samples, value
from tests.transitions import forging

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = secrets.token_urlsafe(32)


@durable.step(name="tests.metrics.add")
def add(a: int, b: int) -> int:
    return a + b


@durable.step(name="tests.metrics.local", local=True)
def local(n: int) -> int:
    return n + 1


@durable.step(name="tests.metrics.flaky", retry=durable.Retry(max_attempts=2, initial="5s"))
def flaky() -> None:
    raise ConnectionError("down")


@durable.workflow(name="tests.metrics.sums")
def sums(ctx, n):
    return ctx.step(local, ctx.step(add, n, 1))


@durable.workflow(name="tests.metrics.fails")
def fails(ctx, _):
    ctx.step(flaky)


@durable.workflow(name="tests.metrics.waits")
def waits(ctx, _):
    return ctx.wait_for_signal("go")


@pytest.fixture
def reader(monkeypatch):
    """An SDK meter provider of this test's own, read by the in-memory reader (the global one
    stays unset for the tests after)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    with metrics._lock:  # the observable counters read the process's tallies: from zero here
        metrics.counters.clear()
        metrics.histograms.clear()
    memory = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[memory])
    monkeypatch.setattr(metrics.otel, "get_meter_provider", lambda: provider)
    metrics.make()  # as durable's ready does with a provider the settings set
    yield memory
    provider.shutdown()


@pytest.fixture
def scrape(client, settings):
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": TOKEN}

    def read():
        response = client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain; version=")
        return prometheus_samples(response.content.decode())

    return read


def test_a_run_records_every_counter_and_histogram_with_its_attributes(durable_env, reader, scrape):
    before = scrape()
    handle = durable.start(sums, 1)
    durable_env.run_until_idle()
    assert durable.result(handle.id) == 3
    seen = otel_points(reader.get_metrics_data())
    scraped = scrape()
    run = {"workflow": "tests.metrics.sums", "namespace": ""}
    queue = Checkpoint.objects.get(run_id=handle.id, seq=0).queue
    assert queue
    add_attempt = {"step": "tests.metrics.add", "queue": queue, "namespace": "", "outcome": "completed"}
    local_attempt = {"step": "tests.metrics.local", "queue": "", "namespace": "", "outcome": "completed"}
    for read, suffix in ((lambda name, **a: value(seen, name, **a), ""),):
        assert read("durable.runs.started", **run) == 1
        assert read("durable.runs.completed", **run) == 1
        assert read("durable.steps.attempts", **add_attempt) == 1
        assert read("durable.steps.attempts", **local_attempt) == 1
        assert read("durable.step.duration", **add_attempt) == 1  # a histogram's count
        assert read("durable.step.queue_wait", step="tests.metrics.add", queue=queue) == 1
        assert read("durable.run.duration", **run, status="completed") == 1
        assert read("durable.turn.duration", **run) >= 2
        assert suffix == ""
    # The same, in the Prometheus text (counted since the scrape before: the registry is the process's).
    delta = {
        name: value(scraped, name, **attrs) - value(before, name, **attrs)
        for name, attrs in [
            ("durable_runs_started_total", run),
            ("durable_runs_completed_total", run),
            ("durable_steps_attempts_total", add_attempt),
            ("durable_steps_attempts_total", local_attempt),
            ("durable_step_queue_wait_count", {"step": "tests.metrics.add", "queue": queue}),
            ("durable_run_duration_count", {**run, "status": "completed"}),
        ]
    }
    assert delta == {
        "durable_runs_started_total": 1,
        "durable_runs_completed_total": 1,
        "durable_steps_attempts_total": 1,
        "durable_step_queue_wait_count": 1,
        "durable_run_duration_count": 1,
    }
    assert (
        value(scraped, "durable_turn_duration_count", **run)
        - value(before, "durable_turn_duration_count", **run)
        >= 2
    )


def test_a_failing_step_counts_a_retried_attempt_then_a_failed_one_and_the_run_failed(durable_env, reader):
    durable.start(fails)
    durable_env.run_until_idle()
    durable_env.advance_time("10s")
    seen = otel_points(reader.get_metrics_data())
    step = {"step": "tests.metrics.flaky"}
    assert value(seen, "durable.steps.attempts", **step, outcome="retried") == 1
    assert value(seen, "durable.steps.attempts", **step, outcome="failed") == 1
    assert value(seen, "durable.steps.attempts", **step, outcome="completed") == 0
    assert value(seen, "durable.runs.failed", workflow="tests.metrics.fails") == 1
    assert value(seen, "durable.run.duration", workflow="tests.metrics.fails", status="failed") == 1


def test_a_cancel_rolled_back_counts_nothing_and_one_committed_counts_once(durable_env, reader, scrape):
    handle = durable.start(waits)
    durable_env.run_until_idle()
    run = {"workflow": "tests.metrics.waits"}
    before = scrape()
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.cancel(handle.id)
        raise RuntimeError("roll back")
    durable_env.run_until_idle()
    assert value(otel_points(reader.get_metrics_data()), "durable.runs.cancelled", **run) == 0
    assert value(scrape(), "durable_runs_cancelled_total", **run) == value(
        before, "durable_runs_cancelled_total", **run
    )
    durable.cancel(handle.id)
    durable_env.run_until_idle()
    assert durable.get_run(handle.id).status == "cancelled"
    assert value(otel_points(reader.get_metrics_data()), "durable.runs.cancelled", **run) == 1
    assert (
        value(scrape(), "durable_runs_cancelled_total", **run)
        == value(before, "durable_runs_cancelled_total", **run) + 1
    )


def test_a_step_result_rolled_back_counts_nothing(reader):
    from durable.engine import observe

    with pytest.raises(RuntimeError), transaction.atomic():
        observe.step_recorded(
            "r1", 0, "tests.metrics.add", 1, queue="q", enqueued_at=None, began=None, status="completed"
        )
        raise RuntimeError("roll back")
    assert (
        value(otel_points(reader.get_metrics_data()), "durable.steps.attempts", step="tests.metrics.add") == 0
    )
    with transaction.atomic():
        observe.step_recorded(
            "r1", 0, "tests.metrics.add", 1, queue="q", enqueued_at=None, began=None, status="completed"
        )
        assert (
            value(otel_points(reader.get_metrics_data()), "durable.steps.attempts", step="tests.metrics.add")
            == 0
        )
    assert (
        value(otel_points(reader.get_metrics_data()), "durable.steps.attempts", step="tests.metrics.add") == 1
    )


def test_the_gauges_are_read_from_the_database_when_collected(durable_env, reader, scrape):
    # durable_env holds the messages start() sends: no turn runs unless the test asks.
    now = clock.now()
    pending = durable.start(waits)  # no turn yet: waiting for its first
    due = durable.start(waits)
    with forging():
        Run.objects.filter(id=due.id).update(status="suspended", wake_at=now - timedelta(seconds=90))
    sent = durable.start(sums, 1)
    with forging():
        Run.objects.filter(id=sent.id).update(status="suspended")
    Checkpoint.objects.create(
        run_id=sent.id,
        seq=0,
        kind="step",
        name="tests.metrics.add",
        status="pending",
        queue="gauges-q",
        enqueued_at=now - timedelta(seconds=40),
        attempt=1,
    )
    seen = otel_points(reader.get_metrics_data())
    scraped = scrape()
    assert value(seen, "durable.runs.waiting_first_turn", namespace="") == 1
    assert value(scraped, "durable_runs_waiting_first_turn") == 1
    assert value(seen, "durable.timers.due", namespace="") == 1
    assert value(scraped, "durable_timers_due") == 1
    assert 90 <= value(seen, "durable.timers.oldest_due_age") < 200
    assert 90 <= value(scraped, "durable_timers_oldest_due_age") < 200
    assert 40 <= value(seen, "durable.steps.oldest_unstarted_age", queue="gauges-q", namespace="") < 150
    assert 40 <= value(scraped, "durable_steps_oldest_unstarted_age", queue="gauges-q") < 150
    assert pending.id != due.id


def test_every_instrument_of_the_table_reaches_the_sdk(durable_env, reader):
    durable.start(sums, 1)
    durable.start(fails)
    durable_env.run_until_idle()
    Checkpoint.objects.filter(status="pending").update(
        started_at=None, enqueued_at=clock.now(), queue="gauges-q", kind="step"
    )
    names = set(otel_points(reader.get_metrics_data()))
    made = {i.name for i in INSTRUMENTS} - {
        "durable.runs.cancelled",
        "durable.runs.dead",
        "durable.runs.failed",
    }
    assert made <= names, sorted(made - names)


def test_without_an_sdk_nothing_is_made_for_the_api_s_default_provider():
    assert metrics._otel_on() is False


def test_the_view_sums_the_files_of_the_host_s_processes(durable_env, scrape, settings, tmp_path):
    import json

    from durable.metrics import shared

    other = {
        "buckets": list(metrics.BUCKETS),
        "counters": [["durable.runs.started", ["tests.metrics.elsewhere", ""], 5.0]],
        "histograms": [
            ["durable.run.duration", ["tests.metrics.elsewhere", "", "completed"], [1] + [0] * 18, 0.004, 1]
        ],
    }
    (tmp_path / "durable-999999.json").write_text(json.dumps(other))
    (tmp_path / "durable-999998.json").write_text(json.dumps({**other, "buckets": [1, 2]}))  # another version
    settings.DURABLE = {**settings.DURABLE, "METRICS_DIR": str(tmp_path)}
    durable.start(sums, 1)
    durable_env.run_until_idle()
    scraped = scrape()
    assert value(scraped, "durable_runs_started_total", workflow="tests.metrics.elsewhere") == 5
    assert value(scraped, "durable_run_duration_bucket", workflow="tests.metrics.elsewhere", le="0.005") == 1
    assert value(scraped, "durable_run_duration_bucket", workflow="tests.metrics.elsewhere", le="+Inf") == 1
    assert (
        value(scraped, "durable_runs_started_total", workflow="tests.metrics.sums") >= 1
    )  # this process's file
    assert (tmp_path / f"durable-{__import__('os').getpid()}.json").exists()
    assert shared.read(str(tmp_path))[0][("durable.runs.started", ("tests.metrics.elsewhere", ""))] == 5


# The view's protection.


def test_without_a_token_setting_an_anonymous_request_is_refused_with_the_reason(client):
    response = client.get("/metrics/")
    assert response.status_code == 403
    assert b"METRICS_TOKEN" in response.content


def test_with_a_token_setting_a_request_without_it_or_with_another_is_refused(client, settings):
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": TOKEN}
    assert client.get("/metrics/").status_code == 401
    assert client.get("/metrics/")["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 401
    assert client.get("/metrics/", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401
    assert client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.post("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_a_staff_user_reads_the_metrics_and_another_user_does_not(client):
    user = User.objects.create_user("reader", password="x")
    client.force_login(user)
    assert client.get("/metrics/").status_code == 403
    user.is_staff = True
    user.save()
    response = client.get("/metrics/")
    assert response.status_code == 200
    assert b"# TYPE durable_timers_due gauge" in response.content


@pytest.mark.parametrize("token", ["short", 12345, " " + "x" * 30, "x" * 20 + " " + "x" * 10])
def test_a_bad_token_setting_is_reported_and_never_accepted(client, settings, token):
    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": token}
    assert [key for key, _ in conf.problems(conf.declared())] == ["METRICS_TOKEN"]
    assert conf.get().METRICS_TOKEN is None
    assert client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 403


def test_the_bad_token_setting_is_a_system_check_error(settings):
    from django.core import checks

    settings.DURABLE = {**settings.DURABLE, "METRICS_TOKEN": "short"}
    errors = [e for e in checks.run_checks() if "METRICS_TOKEN" in str(e)]
    assert errors and all(e.level >= checks.ERROR for e in errors)
    assert ImproperlyConfigured  # the settings still load: the view then admits staff only


def test_a_run_whose_turns_kept_crashing_counts_as_dead(durable_env, reader):
    handle = durable.start(waits)
    Run.objects.filter(id=handle.id).update(recovery_attempts=conf.get().MAX_RECOVERY_ATTEMPTS + 1)
    durable_env.run_until_idle()
    assert durable.get_run(handle.id).status == "dead"
    seen = otel_points(reader.get_metrics_data())
    assert value(seen, "durable.runs.dead", workflow="tests.metrics.waits", namespace="") == 1
    assert value(seen, "durable.turn.duration", workflow="tests.metrics.waits", outcome="dead") == 1


def test_histogram_values_wait_for_the_sdk_s_collection_within_a_bound(reader, monkeypatch, caplog):
    monkeypatch.setattr(metrics, "PENDING_LIMIT", 3)
    for _ in range(5):
        metrics.turn_ended("tests.metrics.bounded", None, "completed", 0.01)
    assert len(metrics._pending) == 3  # recorded into the SDK only when its reader collects
    with caplog.at_level("WARNING", logger="durable.metrics"):
        seen = otel_points(reader.get_metrics_data())
    assert value(seen, "durable.turn.duration", workflow="tests.metrics.bounded") == 3
    assert "2 histogram values were dropped" in caplog.text
    assert metrics._pending == []
    # The view's tallies are not bounded by the buffer: every value is there.
    assert metrics.histograms[("durable.turn.duration", ("tests.metrics.bounded", "", "completed"))][2] == 5


def test_a_metrics_dir_that_is_no_folder_is_reported(settings, tmp_path):
    settings.DURABLE = {**settings.DURABLE, "METRICS_DIR": str(tmp_path / "missing")}
    assert [key for key, _ in conf.problems(conf.declared())] == ["METRICS_DIR"]
    assert conf.get().METRICS_DIR is None
