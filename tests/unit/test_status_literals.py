"""One name per state: no status or flow state is spelled as a string literal where a row is
filtered, written or matched (ORM keywords, ``Q``, raw SQL) outside ``durable/statuses.py``, the
models' own choices and the migrations; the enums say each state once."""

from __future__ import annotations

import re

from tests.spelled import spelled

#: ``status="x"``, ``flow = "x"``, ``status__in=("x", ...``, and SQL's ``status = 'x'`` /
#: ``flow = 'x'`` (an f-string placing the enum, ``'{CheckpointStatus.PENDING}'``, is not a literal).
SPELLED = re.compile(
    r"""\b(status|flow)(__in)?\s*=\s*[(\[]?\s*["'][a-z_]+["']|\b(status|flow)\s*(=|IN \(?)\s*'[a-z_]+'"""
)


def test_no_status_is_spelled_where_rows_are_matched() -> None:
    found = spelled(SPELLED, skip=("statuses.py",))
    assert not found, "use the enums of durable/statuses.py (or the model's choices):\n" + "\n".join(found)


def test_the_check_sees_a_status_spelled_out() -> None:
    for line in (
        '.filter(status="pending")',
        "Q(status='failed')",
        '.filter(status__in=("completed", "failed"))',
        "\"WHERE run_id = %s AND status = 'pending' \"",
        "\"AND (flow IS NULL OR flow = 'held')\"",
        '.update(flow="waiting")',
    ):
        assert SPELLED.search(line), line
    for line in (
        "f\"AND status = '{CheckpointStatus.PENDING}'\"",
        ".filter(status=CheckpointStatus.PENDING)",
        '"status": {"enum": ["suspended"]}',
    ):
        assert not SPELLED.search(line), line
