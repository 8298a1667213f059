"""Run trees read and deleted a level and a slice at a time: a tree as wide as a fan of 10,000
children must never put its whole subtree in one statement (PostgreSQL's protocol carries at most
65,535 parameters)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, models
from django.db.models import signals

from . import offloads, partitions
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
        plain = deletes_plainly(self.model)
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

    def delete_day(self, day: partitions.Day, still: Any, *, offloaded: bool) -> int:
        """Delete the runs of ``day`` (a partitioned history's pair of day partitions) by
        dropping its tables, when none of its runs matches ``still`` (a Q: a run that must stay)
        and no run of another day is a child of one of them; return how many went, 0 when the
        day stays. Call inside a transaction; the day's writes wait for it from the first check.

        Whatever refers to the day's runs from other tables goes first (as a run's deletion takes
        it), and so do the references among the day's own runs: PostgreSQL checks, when a
        partition is detached, that no row refers to one of its rows, its own rows included
        (rewriting them costs nothing that lasts: the rows go with their table)."""
        cascade = deletes_plainly(self.model)
        if cascade is None:
            return 0
        partitions.lock_day(self.db, day)
        in_day = self.filter(id__gte=day.low, id__lt=day.high)
        if in_day.filter(still).exists():
            return 0
        elsewhere = self.filter(parent_id__gte=day.low, parent_id__lt=day.high).exclude(
            id__gte=day.low, id__lt=day.high
        )
        if elsewhere.exists():
            return 0
        gone: int = in_day.count()
        Checkpoint, Signal = referring(self, "checkpoints"), referring(self, "signals")
        if offloaded:
            offloads.release(in_day, ("input", "output"))
            offloads.release(
                Checkpoint.objects.using(self.db).filter(run_id__gte=day.low, run_id__lt=day.high),
                ("input", "output"),
            )
            offloads.release(
                Signal.objects.using(self.db).filter(run_id__gte=day.low, run_id__lt=day.high),
                ("payload", "reply"),
            )
        quote = connections[self.db].ops.quote_name
        with connections[self.db].cursor() as cursor:
            for related, column, deleted in cascade:
                if related is Checkpoint:
                    continue  # its partition of the day goes with the day's runs
                table, where = (
                    quote(related._meta.db_table),
                    f"{quote(column)} >= %s AND {quote(column)} < %s",
                )
                if deleted and related is not self.model:
                    cursor.execute(f"DELETE FROM {table} WHERE {where}", [day.low, day.high])
                else:
                    cursor.execute(
                        f"UPDATE {table} SET {quote(column)} = NULL WHERE {where}", [day.low, day.high]
                    )
        partitions.drop_day(self.db, day)
        return gone


#: What a run's deletion does to the rows that refer to it: (model, column, deleted or set null).
Cascade = list[tuple[type[models.Model], str, bool]]


def deletes_plainly(model: type[models.Model]) -> Cascade | None:
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
