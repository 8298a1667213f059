from __future__ import annotations

import os

from django.apps import AppConfig


class DurableConfig(AppConfig):
    name = "durable"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import celery, checks, conf, definitions, tasks  # noqa: F401 - registers tasks, signals and checks

        setting_changed.connect(conf.reset)
        _use_test_database()
        definitions.autodiscover()


def _use_test_database() -> None:
    # durable_worker starts real workers against the test database pytest-django created.
    name = os.environ.get("DURABLE_TEST_DATABASE_NAME")
    if name:
        from django.db import connections

        from . import conf

        connections[conf.get().DATABASE].settings_dict["NAME"] = name
