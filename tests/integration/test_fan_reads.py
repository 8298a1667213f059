"""What a fan member reads of the checkpoint and fan tables' indexes, pinned at two widths
(PostgreSQL only: counted from ``pg_stat_user_indexes``). A take of a fresh fan's member, its rows
without planner statistics, must stay a lookup by position, and the check that the fan closed
must not read its other members, whatever the fan's width: a fan costs O(N), not O(N²)."""

from __future__ import annotations

import pytest
from django.db import connection

import durable

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="index statistics are PostgreSQL's"),
]


@durable.step(name="tests.fan_reads.member")
def member(i):
    return i


@durable.workflow(name="tests.fan_reads.fan")
def fan(ctx, n):
    return sum(ctx.map(member, range(n)))


def index_reads() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        # On a partitioned history each partition has its indexes: counted under their parent's.
        cursor.execute(
            "SELECT coalesce(parent.relname, s.indexrelname), sum(s.idx_tup_read) FROM pg_stat_user_indexes s "
            "LEFT JOIN pg_inherits i ON i.inhrelid = s.indexrelid LEFT JOIN pg_class parent ON parent.oid = i.inhparent "
            "WHERE s.relname = 'durable_fan' OR s.relname LIKE 'durable\\_checkpoint%' GROUP BY 1"
        )
        return {name: int(reads) for name, reads in cursor.fetchall()}


def reads_per_member(durable_env, width: int) -> dict[str, float]:
    run = durable.start(fan, width)
    durable_env.run_next()  # the turn that positions the fan and sends its members
    before = index_reads()
    durable_env.run_until_idle()
    after = index_reads()
    assert durable.result(run.id) == sum(range(width))
    return {name: (after[name] - before.get(name, 0)) / width for name in after}


def test_a_members_take_and_result_read_a_bounded_number_of_entries_whatever_the_width(durable_env):
    narrow, wide = reads_per_member(durable_env, 100), reads_per_member(durable_env, 5000)
    for per_member in (narrow, wide):
        # The take, the result and the closing turn's read of the history, by position: a few each.
        assert per_member["durable_checkpoint_position"] <= 10, per_member
        assert per_member.get("durable_checkpoint_untaken", 0) <= 1, per_member
        # The fan closes by its count (durable/models/fans.py), never by asking its members.
        assert per_member.get("durable_checkpoint_fan", 0) <= 1, per_member
        # One shard's row per member, plus the versions of it that pruning has not yet removed
        # (a snapshot held elsewhere, autovacuum's ANALYZE under load, keeps them): at most its
        # 128 members' worth, whatever the width; reading every shard would be 40 at 5,000.
        assert per_member.get("durable_fan_shard", 0) <= 12, per_member
    for name, reads in wide.items():
        if name.startswith("durable_checkpoint"):
            assert reads <= narrow.get(name, 0) * 1.2 + 0.5, (name, narrow, wide)
