"""The run list's filters, search and paginator, each bounded whatever the size of the run table.

The filter choices come from code (the registered workflows and their versions) or from small
tables, never from a DISTINCT over the runs; the paginator counts at most COUNT_LIMIT rows.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django.http import HttpRequest

from durable import conf
from durable.definitions import registry
from durable.models import CronSchedule, Run

#: The paginator counts this many matching runs at most; past it the list says "10000+".
COUNT_LIMIT = 10_000

#: ``key=value``: a search attribute, as ``search_attributes`` stores it.
ATTRIBUTE = re.compile(r"^(?P<key>[A-Za-z_][\w.-]*)\s*=\s*(?P<value>.*)$")


class BoundedPaginator(Paginator):
    """A paginator whose count stops at COUNT_LIMIT: a ``COUNT(*)`` over a LIMITed subquery, so a
    filter that matches millions of runs costs as much as one that matches ten thousand."""

    @cached_property
    def count(self) -> int:
        if isinstance(self.object_list, QuerySet):
            return self.object_list[: COUNT_LIMIT + 1].count()
        return len(self.object_list)

    @property
    def limit(self) -> int:
        return COUNT_LIMIT

    @property
    def capped(self) -> bool:
        return self.count > COUNT_LIMIT


class _ChoicesFilter(admin.SimpleListFilter):
    """A filter on a column whose choices are known without reading the runs."""

    field = ""

    def choices_for(self, request: HttpRequest) -> list[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, value or "(none)") for value in self.choices_for(request)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value is None else queryset.filter(**{self.field: value})


class BlockedFilter(admin.SimpleListFilter):
    """Runs parked by non-determinism: their turns wait for code that replays their history."""

    title = "blocked"
    parameter_name = "blocked"
    NON_DETERMINISM = "non_determinism"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(self.NON_DETERMINISM, "blocked by non-determinism")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.blocked() if self.value() == self.NON_DETERMINISM else queryset


class WorkflowFilter(_ChoicesFilter):
    """The workflows registered in this process (a run of another is found by searching)."""

    title = "workflow"
    parameter_name = field = "workflow"

    def choices_for(self, request: HttpRequest) -> list[str]:
        return sorted(registry.workflows)


class VersionFilter(_ChoicesFilter):
    """The versions of the workflow filtered on, or of every registered workflow."""

    title = "version"
    parameter_name = field = "version"

    def choices_for(self, request: HttpRequest) -> list[str]:
        chosen = request.GET.get("workflow")
        versions = registry.workflows.get(chosen, {}) if chosen else None
        if versions is None:
            return sorted({v for known in registry.workflows.values() for v in known})
        return sorted(versions)


class NamespaceFilter(_ChoicesFilter):
    """No namespace, this process's, and those the schedules start runs in."""

    title = "namespace"
    parameter_name = field = "namespace"

    def choices_for(self, request: HttpRequest) -> list[str]:
        settings = conf.get()
        scheduled = CronSchedule.objects.using(settings.DATABASE).values_list("namespace", flat=True)
        names = {"", settings.NAMESPACE or "", *scheduled.distinct()}
        return sorted(names)


def search(queryset: QuerySet[Run], term: str) -> QuerySet[Run]:
    """Runs whose id starts or ends with ``term`` (a time-ordered id's first digits are its
    millisecond, shared by the runs started with it; its last ones are its own), of workflow
    ``term``, tagged ``term``, or, for ``key=value``, whose search attribute ``key`` is ``value``
    (a number or true/false as such)."""
    term = term.strip()
    if not term:
        return queryset
    matched = ATTRIBUTE.match(term)
    if matched:
        key, raw = matched["key"], matched["value"].strip()
        # An alias, not ``search_attributes__<key>``: a key named like a lookup stays a key.
        queryset = queryset.alias(searched=KeyTransform(key, "search_attributes"))
        attribute = Q()
        for value in {raw, *_typed(raw)}:
            attribute |= Q(searched=value)
        return queryset.filter(attribute)
    found = Q(id__startswith=term) | Q(id__endswith=term) | Q(workflow__icontains=term)
    if _tags_contain_supported(queryset):
        found |= Q(tags__contains=[term])
    else:
        # SQLite has no JSON containment: match the quoted tag inside the stored list.
        found |= Q(tags__icontains=f'"{term}"')
    return queryset.filter(found)


def _typed(raw: str) -> list[Any]:
    if raw in ("true", "false"):
        return [raw == "true"]
    try:
        return [int(raw)]
    except ValueError:
        pass
    try:
        return [float(raw)]
    except ValueError:
        return []


def _tags_contain_supported(queryset: QuerySet[Run]) -> bool:
    from django.db import connections

    return connections[queryset.db].features.supports_json_field_contains
