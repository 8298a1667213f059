"""``ctx.upsert_search_attributes``: recorded once per position, merged into the run's row by the
turn's settle (``TurnState.search_attributes``), and queried with the ORM."""

from __future__ import annotations

from typing import Any

from .. import guards
from ..definitions import Workflow, registry
from ..errors import InvalidInput
from ..values import json_value
from .history import COMPLETED
from .positions import Positions

SEARCH_ATTRIBUTES = "search_attributes"


class SearchAttributes(Positions):
    """Mixed into ``Context``."""

    def upsert_search_attributes(self, mapping: dict[str, Any]) -> None:
        """Merge ``mapping`` into the run's search attributes (a None value removes one), checked
        against the workflow's ``search_attributes_schema``; query them with the ORM."""
        checked = check_search_attributes(
            mapping, registry.workflow(self._facts.workflow, self._facts.version)
        )
        self._storable(
            checked, "search attributes", typed=False
        )  # refused when larger than MAX_PAYLOAD_BYTES
        if self._position("value", SEARCH_ATTRIBUTES) is not None:
            return  # recorded by an earlier turn, and merged into the row then
        rec = self._new("value", SEARCH_ATTRIBUTES, status=COMPLETED, output=checked)
        rec.finished_at = self._now()
        merged: dict[str, Any] = {}
        for upsert in sorted(self._turn.records.values(), key=lambda r: r.seq):
            if upsert.kind == "value" and upsert.name == SEARCH_ATTRIBUTES:
                merged.update(upsert.output)
        self._turn.search_attributes = {k: v for k, v in merged.items() if v is not None}


def check_search_attributes(mapping: Any, workflow: Workflow) -> dict[str, Any]:
    """``mapping`` as an upsert takes it: names to JSON values, each of its schema's type."""
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and k for k in mapping):
        raise InvalidInput(f"search attributes are a dict of names to values, got {guards.shown(mapping)}")
    checked: dict[str, Any] = json_value(mapping, "search attributes")
    schema = workflow.search_attributes_schema
    if schema is None:
        return checked
    for name, value in checked.items():
        if name not in schema:
            raise InvalidInput(
                f"search attribute {name!r} is not in {workflow.name}'s search_attributes_schema ({', '.join(schema)})"
            )
        kinds = schema[name] if isinstance(schema[name], tuple) else (schema[name],)
        fits = any(
            isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool) for kind in kinds
        )
        if value is not None and not fits:
            names = " or ".join(kind.__name__ for kind in kinds)
            raise InvalidInput(f"search attribute {name!r} must be {names}, got {guards.shown(value)}")
    return checked
