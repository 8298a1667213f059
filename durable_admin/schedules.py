"""The admin of cron schedules: defined in code or with ``durable.schedule()``, paused, resumed,
triggered or deleted here, each through durable's public API."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import ngettext

import durable
from durable.models import CronSchedule

from . import history
from .rows import DurableRows, json_display, reasons_text, timestamp_display


@admin.register(CronSchedule)
class ScheduleAdmin(DurableRows, admin.ModelAdmin):
    """Schedules are defined in code or with ``durable.schedule()``; here they are paused, resumed,
    triggered or deleted."""

    next_time = timestamp_display("next_at")
    list_display = ("key", "workflow", "cron", "timezone", "overlap", "paused", "next_time", "last_run")
    list_filter = ("paused", "workflow", "declared", "namespace")
    search_fields = ("key", "workflow")
    ordering = ("key",)
    actions = ("pause", "resume", "trigger")
    fields = (
        "key",
        "workflow",
        "cron",
        "timezone",
        "overlap",
        "paused",
        "declared",
        "next_time",
        "last_run",
        "input_json",
        "created_time",
        "updated_time",
    )
    readonly_fields = fields
    input_json = json_display("input", payload=True)

    @admin.display(description="last run")
    def last_run(self, obj: CronSchedule) -> str:
        if not obj.last_run_id:
            return "-"
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:durable_run_change", args=[quote(obj.last_run_id)]),
            obj.last_run_id,
        )

    @admin.action(description="Pause selected schedules", permissions=["steer"])
    def pause(self, request: HttpRequest, queryset: QuerySet[CronSchedule]) -> None:
        done = sum(durable.pause_schedule(key) for key in queryset.values_list("pk", flat=True))
        history.record(request, CronSchedule, queryset.values_list("pk", flat=True), "Paused in the admin")
        self.message_user(request, ngettext("Paused %d schedule.", "Paused %d schedules.", done) % done)

    @admin.action(description="Resume selected schedules", permissions=["steer"])
    def resume(self, request: HttpRequest, queryset: QuerySet[CronSchedule]) -> None:
        resumed, failed = _each(queryset, durable.resume_schedule)
        done = sum(resumed)
        history.record(request, CronSchedule, queryset.values_list("pk", flat=True), "Resumed in the admin")
        self.message_user(request, ngettext("Resumed %d schedule.", "Resumed %d schedules.", done) % done)
        _tell_failures(self, request, failed, "resume")

    @admin.action(description="Start a run of selected schedules now", permissions=["steer"])
    def trigger(self, request: HttpRequest, queryset: QuerySet[CronSchedule]) -> None:
        handles, failed = _each(queryset, durable.trigger_schedule)
        started = [handle.id for handle in handles]
        history.record(request, CronSchedule, queryset.values_list("pk", flat=True), "Triggered in the admin")
        if started:
            self.message_user(
                request,
                ngettext("Started %d run: %s", "Started %d runs: %s", len(started))
                % (len(started), reasons_text(started)),
            )
        _tell_failures(self, request, failed, "start a run of")


def _each(queryset: QuerySet[CronSchedule], call: Any) -> tuple[list[Any], list[str]]:
    """Call ``call(key)`` for each schedule; a refusal (its workflow gone, a cron that never fires)
    becomes a reason to show, not a server error."""
    results, failed = [], []
    for key in queryset.order_by("pk").values_list("pk", flat=True):
        try:
            results.append(call(key))
        except durable.DurableError as exc:
            failed.append(f"{key}: {exc}")
    return results, failed


def _tell_failures(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, failed: list[str], verb: str
) -> None:
    if failed:
        model_admin.message_user(
            request,
            ngettext("Could not %s %d schedule: %s", "Could not %s %d schedules: %s", len(failed))
            % (verb, len(failed), reasons_text(failed)),
            messages.ERROR,
        )
