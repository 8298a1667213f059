"""Filters of the run page: a fan by its position, a JSON value on one line, a duration in words."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django import template
from django.utils.text import Truncator

register = template.Library()

#: A JSON value longer than this is cut in a table cell; the checkpoint's own page has it whole.
JSON_SHOWN = 200


@register.filter
def get_item(mapping: dict[Any, Any], key: Any) -> Any:
    return mapping.get(key) if mapping else None


@register.filter
def json_text(value: Any) -> str:
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
