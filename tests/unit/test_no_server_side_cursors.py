"""No server-side cursor in durable: Django's ``iterator()`` declares one on PostgreSQL, and it does
not survive a pooler in transaction mode (each FETCH may reach another server session than the
DECLARE did), which CI's suite behind PgBouncer met as "cursor ... does not exist"."""

from __future__ import annotations

import re

from tests.spelled import spelled

ITERATOR = re.compile(r"\.iterator\(")


def test_no_query_is_read_through_a_server_side_cursor() -> None:
    found = spelled(ITERATOR)
    assert not found, "read in batches (by id) or whole instead of .iterator():\n" + "\n".join(found)


def test_the_check_sees_an_iterator() -> None:
    assert ITERATOR.search('rows.values_list("id").iterator()')
    assert ITERATOR.search("qs.iterator(chunk_size=100)")
    assert not ITERATOR.search("iter(rows)")
