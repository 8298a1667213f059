"""What every model admin of the console shares: read-only rows read where the engine writes
them, JSON and timestamp columns, filters that need no DISTINCT scan, messages that name reasons."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from durable import conf, reads

from . import payloads

#: Skip reasons named one by one in an action's message; the rest are only counted.
MAX_REASONS_SHOWN = 5


def json_display(field: str, *, payload: bool = False) -> Any:
    """A read-only admin column showing ``field`` as indented JSON; a ``payload`` only to users
    with ``durable.view_payloads``."""

    @admin.display(description=field.replace("_", " "))
    def show(model_admin: admin.options.BaseModelAdmin[Any], obj: Model) -> str:
        if payload and not payloads.visible():
            return payloads.HIDDEN
        value = getattr(obj, field)
        if value is None:
            return model_admin.get_empty_value_display()
        text = json.dumps(value, indent=2, ensure_ascii=False)
        return format_html('<pre style="margin: 0; white-space: pre-wrap">{}</pre>', text)

    return show


def timestamp_display(field: str) -> Any:
    """A read-only column showing ``field`` to the millisecond, sortable like the field."""

    @admin.display(description=field.replace("_", " "), ordering=field)
    def show(model_admin: admin.options.BaseModelAdmin[Any], obj: Model) -> str:
        value = getattr(obj, field)
        if value is None:
            return model_admin.get_empty_value_display()
        local = timezone.localtime(value)
        return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local:%Z}"

    return show


def fixed_choices_filter(field: str, values: tuple[str, ...]) -> type[admin.SimpleListFilter]:
    """A list filter on a column whose values are known, so showing it needs no DISTINCT query."""

    class FixedChoicesFilter(admin.SimpleListFilter):
        title = parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            return [(value, value) for value in values]

        def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
            return queryset.filter(**{field: self.value()}) if self.value() else queryset

    return FixedChoicesFilter


class DurableRows:
    """Rows the engine owns: read from ``DURABLE["DATABASE"]``, never added or edited by a form."""

    # Django shows datetimes to the minute; a run's steps and retries are seconds apart.
    created_time = timestamp_display("created_at")
    updated_time = timestamp_display("updated_at")
    wake_time = timestamp_display("wake_at")
    enqueued_time = timestamp_display("enqueued_at")
    started_time = timestamp_display("started_at")
    finished_time = timestamp_display("finished_at")
    heartbeat_time = timestamp_display("last_heartbeat_at")
    locked_until_time = timestamp_display("locked_until")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # A list may be read from a replica (DURABLE["READ_DATABASE"]): its actions act by id,
        # through the API. A row's own page reads the primary, where a steer just wrote.
        alias = reads.database() if self._listing(request) else conf.get().DATABASE
        return super().get_queryset(request).using(alias)  # type: ignore[misc]

    def _listing(self, request: HttpRequest) -> bool:
        opts = self.opts  # type: ignore[attr-defined]
        match = getattr(request, "resolver_match", None)
        return match is not None and match.url_name == f"{opts.app_label}_{opts.model_name}_changelist"

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with payloads.viewed_by(request):
            return payloads.rendered(super().changeform_view(request, *args, **kwargs))  # type: ignore[misc]

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with payloads.viewed_by(request):
            return payloads.rendered(super().changelist_view(request, *args, **kwargs))  # type: ignore[misc]

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_steer_permission(self, request: HttpRequest) -> bool:
        # Steering (retry, cancel, pause, trigger) is the only change the admin makes, so it
        # takes Django's change permission even though no field is ever editable.
        opts = self.opts  # type: ignore[attr-defined]
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")


class ReadOnlyInline(DurableRows, admin.TabularInline):
    extra = max_num = 0
    can_delete = False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        # A hole in a history breaks replay: rows go only with their run.
        return False


def reasons_text(reasons: list[str]) -> str:
    """Reasons joined for a message, the first MAX_REASONS_SHOWN named and the rest counted."""
    text = "; ".join(reasons[:MAX_REASONS_SHOWN])
    if len(reasons) > MAX_REASONS_SHOWN:
        text += f"; and {len(reasons) - MAX_REASONS_SHOWN} more"
    return text
