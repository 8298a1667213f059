"""Django system checks for the DURABLE setting, and the typed settings object they guard."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings

from durable import checks, conf
from durable.statuses import TERMINAL

# On Django 6 the checks ask the databases too (the embedded default's SQLite is asked whether
# it supports JSONField): the tests that run all the checks, as `manage.py check` does, may query.
runs_all_checks = pytest.mark.django_db


def _errors(durable_setting: Any) -> list[Error]:
    with override_settings(DURABLE=durable_setting):
        return [m for m in checks.check_settings() if m.id == "durable.E001"]


@runs_all_checks
def test_check_command_passes_with_the_default_settings() -> None:
    call_command("check")


def test_default_settings_raise_no_durable_check() -> None:
    assert checks.check_settings() == []


@runs_all_checks
def test_check_command_fails_on_a_bad_durable_value() -> None:
    with override_settings(DURABLE={"LEASE": "soon"}), pytest.raises(SystemCheckError, match="durable.E001"):
        call_command("check")


def test_bad_duration_is_reported_as_e001_naming_the_key() -> None:
    [error] = _errors({"LEASE": "soon"})
    assert isinstance(error, Error)
    assert "LEASE" in error.msg
    assert "'soon' is not a duration" in error.msg


def test_zero_lease_is_refused() -> None:
    [error] = _errors({"LEASE": "0s"})
    assert "LEASE" in error.msg and "longer than zero" in error.msg


@pytest.mark.parametrize(("value", "message"), [("0s", "longer than zero"), ("forever", "is not a duration")])
def test_turn_time_limit_must_be_a_positive_duration(value: str, message: str) -> None:
    [error] = _errors({"TURN_TIME_LIMIT": value})
    assert "TURN_TIME_LIMIT" in error.msg and message in error.msg


def test_turn_time_limit_defaults_to_fifteen_minutes_and_is_read_from_durable() -> None:
    assert conf.load().TURN_TIME_LIMIT.total_seconds() == 15 * 60
    with override_settings(DURABLE={"TURN_TIME_LIMIT": "90s"}):
        assert conf.get().TURN_TIME_LIMIT.total_seconds() == 90


def test_unknown_key_is_reported_by_name() -> None:
    [error] = _errors({"LEASEE": "30s"})
    assert "LEASEE" in error.msg
    assert "unknown key" in error.msg


@pytest.mark.parametrize("value", [0, -1, "5", True, 2.5])
def test_max_recovery_attempts_below_one_or_not_an_int_is_refused(value: object) -> None:
    [error] = _errors({"MAX_RECOVERY_ATTEMPTS": value})
    assert "MAX_RECOVERY_ATTEMPTS" in error.msg


def test_database_naming_a_missing_alias_is_refused() -> None:
    [error] = _errors({"DATABASE": "tests_missing_alias"})
    assert "DATABASE" in error.msg
    assert "'tests_missing_alias' is not a key of DATABASES" in error.msg


@pytest.mark.parametrize("key", ["LISTEN_DATABASE", "READ_DATABASE"])
@pytest.mark.parametrize("alias", ["tests_missing_alias", "", 3])
def test_a_listen_or_read_database_must_be_a_database_alias(key, alias) -> None:
    [error] = _errors({key: alias})
    assert key in error.msg and "must be None or a key of DATABASES" in error.msg


def test_a_replica_is_read_only_on_postgresql() -> None:
    found = _errors({"READ_DATABASE": "default"})
    if connection.vendor == "postgresql":
        assert found == []
    else:
        [error] = found
        assert "a replica is read only on PostgreSQL" in error.msg


def test_empty_default_queue_is_refused() -> None:
    [error] = _errors({"DEFAULT_QUEUE": ""})
    assert "DEFAULT_QUEUE" in error.msg


def test_retention_that_is_not_a_list_is_refused() -> None:
    [error] = _errors({"RETENTION": {"statuses": ["completed"]}})
    assert "RETENTION" in error.msg


def test_every_bad_key_is_reported() -> None:
    errors = _errors({"LEASE": "soon", "TIMER_BATCH_SIZE": 0, "NAMESPACE": 3})
    assert len(errors) == 3


def test_use_tz_false_is_reported_as_e002() -> None:
    with override_settings(USE_TZ=False):
        ids = [m.id for m in checks.check_settings()]
    assert "durable.E002" in ids


def test_durable_setting_that_is_not_a_dict_is_reported() -> None:
    assert _errors([("LEASE", "10s")])


def test_out_of_range_duration_is_reported_not_raised() -> None:
    [error] = _errors({"LEASE": "1000000000d"})
    assert "LEASE" in error.msg


def _loaded(durable_setting: Any) -> dict[str, Any]:
    with override_settings(DURABLE=durable_setting):
        return asdict(conf.get())


def test_get_returns_overridden_typed_values() -> None:
    conf.get()  # fill the cache first: the override must reset it
    loaded = _loaded(
        {"LEASE": "10s", "MAX_RECOVERY_ATTEMPTS": 7, "DEFAULT_QUEUE": "q", "EVENT_BUFFER_TTL": 60}
    )
    assert loaded["LEASE"] == timedelta(seconds=10)
    assert loaded["MAX_RECOVERY_ATTEMPTS"] == 7
    assert loaded["DEFAULT_QUEUE"] == "q"
    assert loaded["EVENT_BUFFER_TTL"] == timedelta(minutes=1)


def test_get_returns_to_defaults_after_the_override_ends() -> None:
    _loaded({"LEASE": "10s"})
    assert asdict(conf.get())["LEASE"] == timedelta(seconds=30)


def test_get_falls_back_to_defaults_for_bad_values() -> None:
    loaded = _loaded({"LEASE": "soon", "TIMER_BATCH_SIZE": 0})
    assert loaded["LEASE"] == timedelta(seconds=30)
    assert loaded["TIMER_BATCH_SIZE"] == 500


def test_get_fills_in_an_instance_id_when_unset() -> None:
    assert _loaded({})["INSTANCE_ID"]


@pytest.mark.django_db
def test_models_and_migrations_agree():
    from io import StringIO

    out = StringIO()
    call_command("makemigrations", "durable", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ({"statuses": ["completed"]}, "needs max_age, max_count or both"),
        ({"max_age": "soon"}, "max_age"),
        ({"max_age": 0}, "longer than zero"),
        ({"max_count": -1}, "max_count must be a whole number"),
        ({"max_count": 10, "statuses": ["running"]}, "statuses must be a list of completed"),
        ({"max_count": 10, "statuses": "failed"}, "statuses must be a list"),
        ({"max_count": 10, "workflows": "shop.fulfil"}, "workflows must be a list"),
        ({"max_count": 10, "keep": True}, "unknown keys ['keep']"),
        ("30d", "must be a dict"),
    ],
)
def test_bad_retention_policies_are_refused(policy, says) -> None:
    [error] = _errors({"RETENTION": [policy]})
    assert "RETENTION" in error.msg and says in error.msg


def test_good_retention_policies_pass_and_load() -> None:
    good = [{"statuses": ["completed"], "max_age": "30d"}, {"max_count": 1000, "workflows": ["shop.fulfil"]}]
    assert _errors({"RETENTION": good}) == []
    with override_settings(DURABLE={"RETENTION": good}):
        first, second = conf.get().RETENTION
    assert (first.statuses, first.max_age, first.max_count) == (("completed",), timedelta(days=30), None)
    assert (second.statuses, second.max_count, second.workflows) == (TERMINAL, 1000, ("shop.fulfil",))


@runs_all_checks
def test_limited_steps_raise_no_warning_now_that_they_are_enforced() -> None:
    from django.core.checks import run_checks

    import durable
    from durable.definitions import registry

    durable.step(lambda: None, name="tests.checks_limited", concurrency=2, rate_limit="5/s")
    try:
        messages = [m for m in run_checks() if "tests.checks_limited" in str(m.msg)]
    finally:
        registry.steps.pop("tests.checks_limited")
    assert messages == []


def test_a_step_or_workflow_name_longer_than_its_column_is_e003() -> None:
    import durable
    from durable.definitions import registry

    long = "tests.checks." + "x" * 300
    step = durable.step(name=long)(lambda: None)
    flow = durable.workflow(name="tests.checks.long_queue", queue="q" * 201)(lambda ctx, _: None)
    try:
        found = [m.msg for m in checks.check_name_lengths() if m.id == "durable.E003"]
        assert len(found) == 2, found
        assert "its name is 313 characters long; at most 255 fit" in found[0]
        assert "its queue is 201 characters long; at most 200 fit" in found[1]
    finally:
        del registry.steps[step.name]
        del registry.workflows[flow.name]
    assert checks.check_name_lengths() == []


def test_connection_reuse_without_health_checks_is_w003() -> None:
    postgres = {"ENGINE": "django.db.backends.postgresql"}
    problems = checks.connection_reuse_problems(1000, "default", {**postgres, "CONN_HEALTH_CHECKS": False})
    assert [m.id for m in problems] == ["durable.W003"]
    assert checks.connection_reuse_problems(1000, "default", {**postgres, "CONN_HEALTH_CHECKS": True}) == []
    assert checks.connection_reuse_problems(None, "default", postgres) == []
    assert checks.check_connection_reuse() == []  # the example project's settings


def test_workers_that_accept_pickle_are_w004() -> None:
    from celery import current_app

    assert checks.check_pickle() == []  # the example project accepts JSON only
    # Set as the project's settings name it (CELERY_ namespace): Celery 5.4 reads the namespaced
    # key before the plain one, so setting conf.accept_content would not be seen there.
    saved = current_app.conf["CELERY_ACCEPT_CONTENT"]
    current_app.conf["CELERY_ACCEPT_CONTENT"] = ["json", "pickle"]
    try:
        assert [m.id for m in checks.check_pickle()] == ["durable.W004"]
    finally:
        current_app.conf["CELERY_ACCEPT_CONTENT"] = saved
    assert checks.check_pickle() == []
