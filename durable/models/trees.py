"""Run trees read and deleted a level and a slice at a time: a tree as wide as a fan of 10,000
children must never put its whole subtree in one statement (PostgreSQL's protocol carries at most
65,535 parameters)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, models
from django.db.models import signals

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

    def delete_in_order(self, run_ids: list[str], *, offloaded: bool | None = None) -> int:
        """Delete these runs, each after every run of ``run_ids`` that descends from it (a
        subtree's ids read a level at a time, reversed), IDS_PER_STATEMENT at a time, with what
        cascades from each slice; return how many runs went. Call inside a transaction.

        A slice's cascade never reaches past the slice (its runs' descendants went before), so no
        statement names more ids than a slice: deleting a root alone would name its whole subtree
        in one ``IN`` list, past what PostgreSQL's protocol carries for a tree of a wide fan.
        ``offloaded``: whether any payload is offloaded (asked here when None)."""
        Checkpoint, Signal = referring(self, "checkpoints"), referring(self, "signals")
        # With no object offloaded at all (the common case), no row can refer to one, and reading
        # every doomed payload to find none cost as much as deleting the rows.
        if offloaded is None:
            offloaded = offloads.any_offloaded(self.db)
        plain = _deletes_plainly(self.model)
        deleted = 0
        for batch in chunked(run_ids, IDS_PER_STATEMENT):
            if offloaded:
                # The objects the slice's payloads were offloaded to go with it (after the commit).
                offloads.release(self.filter(id__in=batch), ("input", "output"))
                offloads.release(
                    Checkpoint.objects.using(self.db).filter(run_id__in=batch), ("input", "output")
                )
                offloads.release(Signal.objects.using(self.db).filter(run_id__in=batch), ("payload", "reply"))
            if plain is None:
                deleted += self.filter(id__in=batch).delete()[1].get(self.model._meta.label, 0)
            else:
                deleted += _delete(self.model, self.db, plain, batch)
        return deleted


#: What a run's deletion does to the rows that refer to it: (model, column, deleted or set null).
Cascade = list[tuple[type[models.Model], str, bool]]


def _deletes_plainly(model: type[models.Model]) -> Cascade | None:
    """The statements deleting ``model``'s rows takes, when it takes nothing else: every row that
    refers to one is deleted (or its reference set to null) and is referred to by none, and no
    receiver listens to any of those deletes. Else None: Django's collector deletes, row by row
    where it must, and sends the signals (what the sweep did for every slice before)."""
    found: Cascade = []
    for relation in model._meta.related_objects:
        related = relation.related_model
        if relation.on_delete not in (models.CASCADE, models.SET_NULL) or relation.many_to_many:
            return None
        if related is not model and (related._meta.related_objects or _heard(related)):
            return None
        found.append((related, relation.field.column, relation.on_delete is models.CASCADE))
    return None if _heard(model) else found


def _heard(model: type[models.Model]) -> bool:
    return bool(signals.pre_delete.has_listeners(model) or signals.post_delete.has_listeners(model))


def _delete(model: type[models.Model], db: str, cascade: Cascade, ids: Sequence[str]) -> int:
    """Delete the rows of ``model`` with ``ids``, what refers to them first, one statement each:
    what Django's collector does when every delete is "fast", without building a query each."""
    connection = connections[db]
    quote = connection.ops.quote_name
    # One array on PostgreSQL: a list of thousands of placeholders costs more to parse than to run.
    params: list[Any]
    if connection.vendor == "postgresql":
        among, params = "= ANY(%s)", [list(ids)]
    else:
        among, params = f"IN ({', '.join(['%s'] * len(ids))})", list(ids)
    with connection.cursor() as cursor:
        for related, column, deleted in cascade:
            table = quote(related._meta.db_table)
            if deleted and related is not model:
                cursor.execute(f"DELETE FROM {table} WHERE {quote(column)} {among}", params)
            elif not deleted:
                cursor.execute(
                    f"UPDATE {table} SET {quote(column)} = NULL WHERE {quote(column)} {among}", params
                )
        # A child run the slice holds goes in this statement; one it does not hold fails the
        # commit (the constraint is checked there), so no tree is ever left cut.
        table, key = quote(model._meta.db_table), quote(model._meta.pk.column)
        cursor.execute(f"DELETE FROM {table} WHERE {key} {among}", params)
        return int(cursor.rowcount)
