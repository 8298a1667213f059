"""App config of the admin for durable's runs: install it next to ``durable`` to browse and steer runs."""

from __future__ import annotations

from django.apps import AppConfig


class DurableAdminConfig(AppConfig):
    name = "durable_admin"
    label = "durable_admin"
    verbose_name = "Durable workflows admin"
