from __future__ import annotations

import os

from django.apps import AppConfig, apps

from . import definitions


class DurableConfig(AppConfig):
    name = "durable"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed
        from django.utils.module_loading import autodiscover_modules

        from . import celery, checks, conf, metrics, tasks  # noqa: F401 - registers tasks, signals and checks

        setting_changed.connect(conf.reset)
        conf.reset()  # tells the value converter USE_TZ
        _use_test_database()
        # Import ``workflows`` from every installed app, as the admin does with ``admin``.
        autodiscover_modules("workflows")
        metrics.make()  # with a provider the settings set, the gauges are observed from the start


def _app_label(module: str) -> str | None:
    # Default names are "<app label>.<function>" once the app registry can tell.
    if not apps.apps_ready:
        return None
    config = apps.get_containing_app_config(module)
    return config.label if config else None


# Installed when Django imports this module, before any app's ready() may import workflows.
definitions.app_label_of = _app_label


def _use_test_database() -> None:
    # durable_worker starts real workers against the test database pytest-django created.
    name = os.environ.get("DURABLE_TEST_DATABASE_NAME")
    if name:
        from django.db import connections

        from . import conf

        settings = conf.get()
        for alias in {settings.DATABASE, settings.LISTEN_DATABASE or settings.DATABASE}:
            connections[alias].settings_dict["NAME"] = name
