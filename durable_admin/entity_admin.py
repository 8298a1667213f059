"""ModelAdmins for durable entities: each key with its state and recent ops, and the ops
themselves. Read-only: ops are sent with ``durable.signal_entity``, never written here."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.text import Truncator

from durable import conf
from durable.models import Entity, EntityOp, OpStatus

from . import payloads
from .rows import DurableRows, json_display, timestamp_display

#: Ops shown on an entity's page, newest first.
RECENT_OPS = 20


def _payload(value: Any) -> str:
    return _short(value) if payloads.visible() else payloads.HIDDEN


def _short(value: Any) -> str:
    return "" if value is None else Truncator(str(value)).chars(60)


@admin.register(Entity)
class EntityAdmin(DurableRows, admin.ModelAdmin):
    """One row per key an op has reached: its state after the last applied op."""

    list_display = ("name", "key", "applied", "pending_ops", "last_op_link", "updated_time")
    list_filter = ("name",)
    search_fields = ("name", "key")
    ordering = ("name", "key")
    show_full_result_count = False
    fields = (
        "name",
        "key",
        "version",
        "applied",
        "pending_ops",
        "last_op_link",
        "state_json",
        "recent_ops",
        "created_time",
        "updated_time",
    )
    readonly_fields = fields
    state_json = json_display("state", payload=True)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a key's state goes with its ops, never on its own

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        pending = (
            EntityOp.objects.filter(entity=OuterRef("name"), key=OuterRef("key"), status=OpStatus.PENDING)
            .order_by()
            .values("entity")
            .annotate(n=Count("id"))
            .values("n")
        )
        return super().get_queryset(request).annotate(pending_count=Coalesce(Subquery(pending), 0))

    @admin.display(description="pending ops", ordering="pending_count")
    def pending_ops(self, obj: Entity) -> str:
        count = getattr(obj, "pending_count", 0)
        if not count:
            return "0"
        query = urlencode({"entity": obj.name, "key": obj.key, "status__exact": OpStatus.PENDING})
        return format_html(
            '<a href="{}?{}">{}</a>', reverse("admin:durable_entityop_changelist"), query, count
        )

    @admin.display(description="last op")
    def last_op_link(self, obj: Entity) -> str:
        if obj.last_op is None:
            return "-"
        return format_html(
            '<a href="{}">#{}</a>', reverse("admin:durable_entityop_change", args=[obj.last_op]), obj.last_op
        )

    @admin.display(description="recent ops")
    def recent_ops(self, obj: Entity) -> str:
        ops = EntityOp.objects.using(conf.get().DATABASE).filter(entity=obj.name, key=obj.key).order_by("-id")
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">#{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:durable_entityop_change", args=[op.id]),
                    op.id,
                    op.op,
                    op.status,
                    _short(op.arg) if payloads.visible() else payloads.HIDDEN,
                    _short(op.error.get("message")) if op.error else _payload(op.result),
                )
                for op in ops[:RECENT_OPS]
            ),
        )
        return format_html(
            "<table><tr><th>op</th><th>name</th><th>status</th><th>arg</th><th>result or error</th></tr>{}</table>",
            rows,
        )


@admin.register(EntityOp)
class EntityOpAdmin(DurableRows, admin.ModelAdmin):
    """Every op sent to an entity key, in arrival order (its id)."""

    list_display = ("id", "entity", "key", "op", "status", "created_time", "applied_time")
    list_filter = ("status", "entity", "namespace")
    search_fields = ("key", "op_id")
    ordering = ("-id",)
    show_full_result_count = False
    fields = (
        "id",
        "entity",
        "key",
        "op",
        "op_id",
        "namespace",
        "status",
        "caller_link",
        "arg_json",
        "result_json",
        "error_json",
        "created_time",
        "applied_time",
    )
    readonly_fields = fields
    applied_time = timestamp_display("applied_at")
    arg_json = json_display("arg", payload=True)
    result_json = json_display("result", payload=True)
    error_json = json_display("error")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a pending op deleted here would be lost; settled ones go by ENTITY_OPS_KEPT

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # The entity page links here with ?entity=..&key=..: the ops of one key.
        return lookup in ("entity", "key") or super().lookup_allowed(lookup, value, request)

    @admin.display(description="caller")
    def caller_link(self, obj: EntityOp) -> str:
        if not obj.caller_run_id:
            return "-"
        return format_html(
            '<a href="{}">{} #{}</a>',
            reverse("admin:durable_run_change", args=[quote(obj.caller_run_id)]),
            obj.caller_run_id,
            obj.caller_seq,
        )
