"""Run trees read and deleted a level and a slice at a time: a tree as wide as a fan of 10,000
children must never put its whole subtree in one statement (PostgreSQL's protocol carries at most
65,535 parameters)."""

from __future__ import annotations

from typing import Any

from django.db import models

from . import offloads
from .base import IDS_PER_STATEMENT, chunked, referring


class RunTrees(models.QuerySet[Any]):
    """The run queryset's reads and deletes over whole trees of runs."""

    def children_of(self, parents: list[str], *fields: str) -> list[tuple[Any, ...]]:
        """``fields`` of the runs whose parent is one of ``parents``: one statement per
        IDS_PER_STATEMENT parents, so a level of a tree as wide as a fan is read too."""
        found: list[tuple[Any, ...]] = []
        for batch in chunked(parents, IDS_PER_STATEMENT):
            found += self.filter(parent_id__in=batch).values_list(*fields)
        return found

    def delete_in_order(self, run_ids: list[str]) -> int:
        """Delete these runs, each after every run of ``run_ids`` that descends from it (a
        subtree's ids read a level at a time, reversed), IDS_PER_STATEMENT at a time, with what
        cascades from each slice; return how many runs went. Call inside a transaction.

        A slice's cascade never reaches past the slice (its runs' descendants went before), so no
        statement names more ids than a slice: deleting a root alone would name its whole subtree
        in one ``IN`` list, past what PostgreSQL's protocol carries for a tree of a wide fan."""
        Checkpoint, Signal = referring(self, "checkpoints"), referring(self, "signals")

        deleted = 0
        for batch in chunked(run_ids, IDS_PER_STATEMENT):
            # The objects the slice's payloads were offloaded to go with it (after the commit).
            offloads.release(self.filter(id__in=batch), ("input", "output"))
            offloads.release(Checkpoint.objects.using(self.db).filter(run_id__in=batch), ("input", "output"))
            offloads.release(Signal.objects.using(self.db).filter(run_id__in=batch), ("payload", "reply"))
            deleted += self.filter(id__in=batch).delete()[1].get(self.model._meta.label, 0)
        return deleted
