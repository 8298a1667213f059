"""How many members of each fan are still pending, kept apart from the fan's positions, so the
member that settles last knows it without reading the others.

Asking the members themselves ("is any still pending?") reads past an index entry for every
member settled since the last vacuum: O(N) per member, O(N²) per fan. One count per fan does
better but not enough: a row updated N times in place (HOT) still moves to another page each
time its page fills, and each move leaves an index entry that lookups read past until a vacuum.
So a fan's count is split in shards of ``SHARD`` members, each a small row of its own updated at
most ``SHARD`` times; the member that empties a shard reads the fan's other shards (after its
commit, so the last one always sees them all empty): O(1) per member, O((N / SHARD)²) per fan.

A fan keeps a count only when one turn positioned it whole; otherwise (positions forgotten by a
retry and taken again) its members are asked, as before. A count too high would leave the run
to its safety-net wake; too low, it wakes a turn that finds members pending and waits again.
"""

from __future__ import annotations

from collections import Counter

from django.db import connections, models

from .runs import Run

#: Members per shard of a fan's count.
SHARD = 128


def shard(first: int, seq: int) -> int:
    """The shard of the fan starting at ``first`` that counts its member at position ``seq``."""
    return (seq - first) // SHARD


class FanQuerySet(models.QuerySet["Fan"]):
    def keep(self, run_id: str, members: dict[int, list[int]]) -> None:
        """Count the pending members of each new fan of ``run_id`` (its first position → their
        positions), in the transaction that writes them."""
        rows = [
            Fan(run_id=run_id, first=first, shard=part, pending=count)
            for first, seqs in members.items()
            for part, count in Counter(shard(first, seq) for seq in seqs).items()
        ]
        if rows:
            # Counts left by a fan positioned before, forgotten and positioned again, are replaced.
            self.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["run", "first", "shard"],
                update_fields=["pending"],
            )

    def leave(self, run_id: str, first: int, seq: int, members: int = 1) -> int | None:
        """``members`` of the fan counted in ``seq``'s shard settled in this transaction: count
        them out, and say how many its shard has left (None: the fan keeps no count).

        The row stays locked to the transaction's end, so members settling at once count out one
        after the other. Call it after the members' own writes and before the run's row is
        locked: the order every writer keeps."""
        quote = connections[self.db].ops.quote_name
        table, pending = quote(Fan._meta.db_table), quote("pending")
        with connections[self.db].cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {pending} = {pending} - %s "
                f"WHERE run_id = %s AND {quote('first')} = %s AND {quote('shard')} = %s RETURNING {pending}",
                [members, run_id, first, shard(first, seq)],
            )
            row = cursor.fetchone()
        return None if row is None else row[0]

    def closed(self, run_id: str, first: int) -> bool | None:
        """Whether every shard of the fan is empty (asked once a member emptied its own, after its
        commit); None if a count went below zero and cannot be believed."""
        counts = list(self.filter(run_id=run_id, first=first).values_list("pending", flat=True))
        if not counts or min(counts) < 0:
            return None
        return bool(max(counts) == 0)

    def forget(self, run_id: str, firsts: list[int] | None = None) -> None:
        """Keep no count for these fans of the run (all of them if None): their members changed
        in a way a count does not follow (forgotten by a retry, reopened)."""
        fans = self.filter(run_id=run_id)
        if firsts is not None:
            fans = fans.filter(first__in=firsts)
        fans.delete()


class Fan(models.Model):
    """One shard of the count of a fan's pending members (``first``: the fan's first position,
    its members' ``fan``)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="fans", db_index=False)
    first = models.PositiveIntegerField()
    shard = models.PositiveIntegerField()
    #: Members of this shard still pending. Signed: a count gone wrong must not fail a write.
    pending = models.IntegerField()

    objects = FanQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "first", "shard"], name="durable_fan_shard")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.first} fan, shard {self.shard} ({self.pending} pending)"
