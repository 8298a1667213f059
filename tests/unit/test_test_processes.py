"""The README's test command runs the suite in processes side by side (pytest-xdist): each
process's broker is its own (project/settings.py), so one process's workers never take another's
messages, and a broker that cannot be split is refused with what to do."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from project.settings import broker_of_test_process


def test_each_process_has_a_redis_database_of_its_own():
    assert broker_of_test_process("redis://127.0.0.1:6379/0", "gw0") == "redis://127.0.0.1:6379/0"
    assert broker_of_test_process("redis://127.0.0.1:6379/4", "gw3") == "redis://127.0.0.1:6379/7"
    assert broker_of_test_process("redis://:pw@redis:6379", "gw1") == "redis://:pw@redis:6379/1"


def test_more_processes_than_redis_has_databases_is_refused():
    with pytest.raises(ImproperlyConfigured, match="fewer processes"):
        broker_of_test_process("redis://127.0.0.1:6379/14", "gw2")


def test_the_embedded_broker_is_split_by_folder_and_rabbitmq_is_refused_side_by_side():
    assert broker_of_test_process("filesystem://", "gw5") == "filesystem://"
    assert broker_of_test_process("amqp://guest:guest@127.0.0.1:5672/ci", "gw0").endswith("/ci")
    with pytest.raises(ImproperlyConfigured, match="pytest -n 0"):
        broker_of_test_process("amqp://guest:guest@127.0.0.1:5672/ci", "gw1")
