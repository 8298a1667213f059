"""Filters and tags of the console: a fan by its position, a JSON value on one line, a duration in
words, and a date drill-down that needs no DISTINCT over the runs."""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

from django import template
from django.db.models import Max, Min
from django.utils import formats, timezone
from django.utils.text import Truncator, capfirst
from django.utils.translation import gettext as _

from .. import payloads

register = template.Library()

#: A JSON value longer than this is cut in a table cell; the checkpoint's own page has it whole.
JSON_SHOWN = 200


@register.filter
def get_item(mapping: dict[Any, Any], key: Any) -> Any:
    return mapping.get(key) if mapping else None


@register.filter
def json_text(value: Any) -> str:
    """A payload, short, to users with ``durable.view_payloads``; that it is hidden to others."""
    if not payloads.visible():
        return payloads.HIDDEN
    return Truncator(json.dumps(value, ensure_ascii=False, default=str)).chars(JSON_SHOWN)


@register.filter
def duration_text(value: timedelta | None) -> str:
    """``12 ms``, ``3.4 s``, ``2 min 5 s``, ``3 h 20 min``: short enough for a table cell."""
    if value is None:
        return ""
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


@register.inclusion_tag("admin/date_hierarchy.html")
def bounded_date_hierarchy(cl: Any) -> dict[str, Any]:
    """Django's date drill-down, drawn from one MIN/MAX query on the indexed column instead of a
    DISTINCT over every run: each year, month or day between the first and the last run is a
    choice, including one that holds no run."""
    field = cl.date_hierarchy
    names = {part: f"{field}__{part}" for part in ("year", "month", "day")}
    chosen = {part: cl.params.get(name) for part, name in names.items()}

    def link(filters: dict[str, Any]) -> str:
        return cl.get_query_string(filters, [f"{field}__"])

    if chosen["year"] and chosen["month"] and chosen["day"]:
        day = date(int(chosen["year"]), int(chosen["month"]), int(chosen["day"]))
        return {
            "show": True,
            "back": {
                "link": link({names["year"]: day.year, names["month"]: day.month}),
                "title": capfirst(formats.date_format(day, "YEAR_MONTH_FORMAT")),
            },
            "choices": [{"title": capfirst(formats.date_format(day, "MONTH_DAY_FORMAT"))}],
        }
    span = cl.queryset.aggregate(first=Min(field), last=Max(field))
    if not (span["first"] and span["last"]):
        return {"show": False}
    first, last = (timezone.localtime(span[k]) for k in ("first", "last"))
    year = int(chosen["year"]) if chosen["year"] else (first.year if first.year == last.year else None)
    month = int(chosen["month"]) if chosen["month"] else None
    if year and month is None and first.year == last.year and first.month == last.month:
        month = first.month
    if year and month:
        days = [date(year, month, d) for d in range(first.day, last.day + 1)]
        back = {"link": link({names["year"]: year}), "title": str(year)}
        return {
            "show": True,
            "back": back,
            "choices": [
                {
                    "link": link({names["year"]: year, names["month"]: month, names["day"]: day.day}),
                    "title": capfirst(formats.date_format(day, "MONTH_DAY_FORMAT")),
                }
                for day in days
            ],
        }
    if year:
        months = [date(year, m, 1) for m in range(first.month, last.month + 1)]
        return {
            "show": True,
            "back": {"link": link({}), "title": _("All dates")},
            "choices": [
                {
                    "link": link({names["year"]: year, names["month"]: m.month}),
                    "title": capfirst(formats.date_format(m, "YEAR_MONTH_FORMAT")),
                }
                for m in months
            ],
        }
    return {
        "show": True,
        "back": None,
        "choices": [
            {"link": link({names["year"]: y}), "title": str(y)} for y in range(first.year, last.year + 1)
        ],
    }
