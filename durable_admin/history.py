"""Django admin history (LogEntry) for what durable's admin actions did, so an operator's retry
or cancel shows on the object's History page like any edit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import Model
from django.http import HttpRequest


def record(request: HttpRequest, model: type[Model], pks: Iterable[Any], message: str) -> None:
    """Write one CHANGE entry per object of ``model`` in ``pks`` with ``message``."""
    pks = list(pks)
    user = getattr(request, "user", None)
    if not pks or user is None or user.pk is None:
        return
    objects = list(model._default_manager.filter(pk__in=pks))
    if objects:
        LogEntry.objects.log_actions(user.pk, objects, CHANGE, change_message=message, single_object=False)
