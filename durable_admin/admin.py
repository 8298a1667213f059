"""ModelAdmins for durable's runs and checkpoints: every field read-only, runs steered by actions.

Nothing here writes a row itself: retry, cancel and delete go through durable's public API, so the
admin can never put a run in a state the engine does not expect.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.text import Truncator
from django.utils.translation import ngettext

import durable
from durable.engine.diagnosis import explain
from durable.models import Checkpoint, Event, Run
from durable.statuses import UNFINISHED, CheckpointStatus

from . import diagnosis, history, run_list, run_page
from .rows import (
    DurableRows,
    ReadOnlyInline,
    fixed_choices_filter,
    json_display,
    reasons_text,
)
from .run_actions import RunActions, allowed, buttons_for
from .templatetags.durable_console import duration_text

#: Runs named on the page that asks before "Cancel selected runs"; the rest are only counted.
CONFIRM_SHOWN = 20

#: Checkpoint kinds and statuses, fixed so the filters need no DISTINCT scan
#: over what can be the largest table in the project.
CHECKPOINT_KINDS = (
    "step",
    "sleep",
    "signal",
    "any_signal",
    "update",
    "message",
    "reply",
    "event",
    "child",
    "entity",
    "value",
    "expose",
    "stream",
    "close_stream",
    "patch",
    "compensation",
    "cancel",
    "resumed",
    "send_signal",
    "send_event",
    "start",
)
CHECKPOINT_STATUSES = tuple(CheckpointStatus)


@admin.display(description="flow limit")
def flow_summary(model_admin: admin.options.BaseModelAdmin[Any], obj: Checkpoint) -> str:
    """What a step attempt is doing under its fleet-wide limit, and which limit that is."""
    return run_page.flow_text(obj) or model_admin.get_empty_value_display()


@admin.display(description="error")
def error_summary(model_admin: admin.options.BaseModelAdmin[Any], obj: Checkpoint) -> str:
    """``Type: message`` of the step's last error, short enough for a table cell."""
    error = obj.error
    if not error:
        return model_admin.get_empty_value_display()
    if isinstance(error, dict):
        error = f"{error.get('type') or 'Error'}: {error.get('message')}"
    return Truncator(str(error)).chars(120)


class RunChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Any]:
        # The list shows no payload, and each may be up to MAX_PAYLOAD_BYTES: do not load them.
        queryset = super().get_queryset(request, *args, **kwargs)
        return queryset.defer("input", "output", "error", "search_attributes", "exposed", "failed_seqs")


@admin.register(Run)
class RunAdmin(RunActions, DurableRows, admin.ModelAdmin):
    list_display = (
        "id",
        "workflow_name",
        "version",
        "status_badge",
        "created",
        "took",
        "recoveries",
    )
    list_filter = (
        "status",
        run_list.BlockedFilter,
        run_list.WorkflowFilter,
        run_list.VersionFilter,
        run_list.NamespaceFilter,
    )
    # Counts next to each filter choice, on request: they are one aggregate query over the runs
    # the other filters select, which a large table makes slow on every page load.
    show_facets = admin.ShowFacets.ALLOW
    search_fields = ("id",)
    search_help_text = "A run id (or its start), a workflow name, a tag, or a search attribute as key=value."
    ordering = ("-created_at",)
    date_hierarchy = "created_at"
    # A COUNT(*) over every run on each page load is what makes big changelists slow.
    show_full_result_count = False
    paginator = run_list.BoundedPaginator
    actions = ("retry_runs", "cancel_runs")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    ("workflow", "version"),
                    ("status", "namespace", "queue"),
                    ("tags", "history"),
                )
            },
        ),
        ("Failed attempts", {"fields": ("attempt_errors",)}),
        (
            "Data",
            {"fields": ("input_json", "output_json", "error_json", "search_attributes_json", "exposed_json")},
        ),
        (
            "Timing",
            {"fields": ("created_time", "updated_time", "started_time", "finished_time", "safety_net")},
        ),
        (
            "Engine",
            {
                "fields": ("recovery_attempts", "locked_by", "locked_until_time", "wakes", "failed_seqs"),
                "classes": ("collapse",),
            },
        ),
    )
    readonly_fields = tuple(
        name
        for _, options in fieldsets
        for line in options["fields"]
        for name in (line if isinstance(line, tuple) else (line,))
    )

    class Media:
        css = {"all": ("durable_admin/console.css",)}

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Run) -> str:
        return format_html('<span class="durable-status durable-status-{}">{}</span>', obj.status, obj.status)

    @admin.display(description="workflow", ordering="workflow")
    def workflow_name(self, obj: Run) -> str:
        # A narrow list breaks a long name after its dots and underscores, not inside a word.
        parts = re.split(r"(?<=[._])", obj.workflow)
        return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in parts))

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Run) -> str:
        # To the second in the list, so a row fits a laptop's width; the run page has the rest.
        # The date and the time each stay whole: a narrow list breaks between them.
        local = timezone.localtime(obj.created_at)
        return format_html(
            '<span class="durable-nowrap">{}</span> <span class="durable-nowrap">{}</span>',
            f"{local:%Y-%m-%d}",
            f"{local:%H:%M:%S}",
        )

    @admin.display(description="safety-net check at")
    def safety_net(self, obj: Run) -> str:
        # The run's wake_at is when the timer sweep looks at it next: its earliest timer or,
        # later, a check that nothing was lost. Its timers are under "Waits for"; shown beside
        # them as "wake at" it read as a second, contradicting time.
        if obj.status not in UNFINISHED or obj.wake_at is None:
            return self.get_empty_value_display()
        local = timezone.localtime(obj.wake_at)
        return format_html(
            "{} <small>(the timer sweep looks at the run again then, if nothing woke it before; "
            "what it waits for is under Now)</small>",
            f"{local:%Y-%m-%d %H:%M:%S} {local:%Z}",
        )

    @admin.display(description="took")
    def took(self, obj: Run) -> str:
        if obj.started_at is None or obj.finished_at is None:
            return self.get_empty_value_display()
        return duration_text(obj.finished_at - obj.started_at)

    @admin.display(description="recoveries", ordering="recovery_attempts")
    def recoveries(self, obj: Run) -> int:
        return obj.recovery_attempts

    def get_urls(self) -> list[Any]:
        return self.action_urls() + super().get_urls()

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Run | None = None,
    ) -> Any:
        if obj is not None:
            context.update(
                run_page.context(request, obj),
                buttons=buttons_for(request, obj),
                fork_url=reverse("admin:durable_run_fork", args=[quote(obj.pk)])
                if allowed(request, "fork")
                else "",
                stuck=[reason.message for reason in explain(obj) if reason.stuck],
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Run], search_term: str
    ) -> tuple[QuerySet[Run], bool]:
        return run_list.search(queryset, search_term), False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return allowed(request, "retry")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return allowed(request, "cancel")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def delete_model(self, request: HttpRequest, obj: Run) -> None:
        durable.delete_run(obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        for run_id in queryset.values_list("pk", flat=True):
            # A child may already have gone with its parent earlier in this loop.
            with contextlib.suppress(durable.RunNotFound):
                durable.delete_run(run_id)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, Any, Any]:
        # Django's collector would list every checkpoint of every run (a fan of 10,000 is 10,000
        # lines and as many rows read): name the runs of the subtrees, count their rows.
        return run_page.deletion_summary([obj.pk for obj in objs])

    # -- change page -------------------------------------------------------------------------

    attempt_errors = diagnosis.attempt_errors
    input_json = json_display("input", payload=True)
    output_json = json_display("output", payload=True)
    error_json = json_display("error")
    search_attributes_json = json_display("search_attributes")
    exposed_json = json_display("exposed", payload=True)

    @admin.display(description="checkpoints")
    def history(self, obj: Run) -> str:
        # The inline shows every row at once; the changelist pages and filters a long history.
        url = reverse("admin:durable_checkpoint_changelist") + "?" + urlencode({"run": obj.pk})
        count = obj.checkpoints.count()
        return format_html('<a href="{}">{} checkpoint{}</a>', url, count, "" if count == 1 else "s")

    # -- actions -----------------------------------------------------------------------------

    @admin.action(description="Retry selected runs", permissions=["retry"])
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        retried, skipped = 0, []
        for run_id in _ids(queryset):
            try:
                durable.retry(run_id)
            except durable.DurableError as exc:
                skipped.append(str(exc))
            else:
                retried += 1
                history.record(request, Run, [run_id], "Retried in the admin")
        self._tell(
            request,
            messages.SUCCESS,
            retried,
            "Retried %d run; it goes on from where it stopped.",
            "Retried %d runs; they go on from where they stopped.",
        )
        self._tell(
            request,
            messages.WARNING,
            skipped,
            "Skipped %d run that cannot be retried: %s",
            "Skipped %d runs that cannot be retried: %s",
        )

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> TemplateResponse | None:
        if request.POST.get("post") != "yes":
            # Asks first, as Django's "Delete selected" does: a cancel cannot be taken back.
            return self._confirm_cancel(request, queryset)
        cancelled, finished, skipped = 0, 0, []
        # Stored as the run's error message: who cancelled it stays visible on the run.
        reason = f"cancelled in the admin by {request.user.get_username() or 'an anonymous user'}"
        for run_id in _ids(queryset):
            try:
                if durable.cancel(run_id, reason=reason):
                    cancelled += 1
                    history.record(request, Run, [run_id], "Cancelled in the admin")
                else:
                    finished += 1
            except durable.DurableError as exc:
                skipped.append(str(exc))
        self._tell(request, messages.SUCCESS, cancelled, "Cancelled %d run.", "Cancelled %d runs.")
        self._tell(
            request,
            messages.WARNING,
            finished,
            "%d run had already finished; left as it was.",
            "%d runs had already finished; left as they were.",
        )
        self._tell(
            request, messages.ERROR, skipped, "Could not cancel %d run: %s", "Could not cancel %d runs: %s"
        )
        return None

    def _confirm_cancel(self, request: HttpRequest, queryset: QuerySet[Run]) -> TemplateResponse:
        shown = list(queryset.only("id", "workflow", "status").order_by("-created_at")[: CONFIRM_SHOWN + 1])
        across = request.POST.get("select_across") == "1"
        count = queryset.count() if across or len(shown) > CONFIRM_SHOWN else len(shown)
        context = {
            **self.admin_site.each_context(request),
            "title": "Cancel selected runs?",
            "opts": Run._meta,
            "count": count,
            "shown": shown[:CONFIRM_SHOWN],
            "more": max(count - CONFIRM_SHOWN, 0),
            "selected": [] if across else request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": "1" if across else "0",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "back_url": f"{reverse('admin:durable_run_changelist')}?{request.GET.urlencode()}".rstrip("?"),
        }
        return TemplateResponse(request, "admin/durable/run/cancel_selected_confirm.html", context)

    def _tell(self, request: HttpRequest, level: int, what: int | list[str], one: str, many: str) -> None:
        """Report a count, or the reasons runs were skipped, unless there is nothing to report."""
        if not what:
            return
        count = len(what) if isinstance(what, list) else what
        values = (count, reasons_text(what)) if isinstance(what, list) else count
        self.message_user(request, ngettext(one, many, count) % values, level)


def _ids(queryset: QuerySet[Run]) -> list[str]:
    # Ids first, then one API call each: every call is its own transaction, as from a shell.
    return list(queryset.order_by("created_at", "pk").values_list("pk", flat=True))


@admin.register(Checkpoint)
class CheckpointAdmin(DurableRows, admin.ModelAdmin):
    list_display = (
        "run_link",
        "seq",
        "kind",
        "name",
        "status",
        "attempt",
        "started_time",
        "finished_time",
        "flow_limit",
        "error_message",
    )
    # The run column is its own link, so the row's change link sits on seq and name.
    list_display_links = ("seq", "name")
    list_filter = (
        fixed_choices_filter("kind", CHECKPOINT_KINDS),
        fixed_choices_filter("status", CHECKPOINT_STATUSES),
    )
    search_fields = ("=run__id", "name")
    # Newest rows first, on the primary key's index rather than a sort over (run, seq).
    ordering = ("-id",)
    show_full_result_count = False
    fields = readonly_fields = (
        "run",
        "seq",
        "kind",
        "name",
        "status",
        "attempt",
        "queue",
        "input_json",
        "output_json",
        "error_json",
        "wake_time",
        "enqueued_time",
        "started_time",
        "finished_time",
        "heartbeat_time",
        "progress_json",
        "flow_limit",
    )

    has_delete_permission = ReadOnlyInline.has_delete_permission

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: Checkpoint) -> str:
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:durable_run_change", args=[quote(obj.run_id)]), obj.run_id
        )

    error_message = error_summary
    flow_limit = flow_summary
    input_json = json_display("input", payload=True)
    output_json = json_display("output", payload=True)
    error_json = json_display("error")
    progress_json = json_display("progress", payload=True)


@admin.register(Event)
class EventAdmin(DurableRows, admin.ModelAdmin):
    """Published events, kept for EVENT_BUFFER_TTL for the waits that come later."""

    list_display = ("id", "name", "created_time")
    list_filter = ("name",)
    search_fields = ("name",)
    ordering = ("-id",)
    show_full_result_count = False
    fields = ("id", "name", "created_time", "payload_json")
    readonly_fields = fields
    payload_json = json_display("payload", payload=True)


# Registered here so that installing durable_admin is enough (admin autodiscovery imports admin.py).
from . import entity_admin as _entities  # noqa: E402, F401
from . import schedules as _schedules  # noqa: E402, F401
