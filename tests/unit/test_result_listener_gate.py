"""Which drivers get a result listener: psycopg 3.2 or later, whose ``notifies()`` waits with a
timeout (3.1's takes none: a listener there would fail at every wait)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from durable import waiting


@pytest.mark.parametrize(
    ("name", "version", "listens"),
    [
        ("psycopg", "3.3.9", True),
        ("psycopg", "3.2.0", True),
        ("psycopg", "3.1.8", False),
        ("psycopg", "4.0.0.dev1", True),
        ("psycopg2", "2.9.9 (dt dec pq3 ext lo64)", False),
    ],
)
def test_a_listener_needs_psycopg_3_2(name, version, listens) -> None:
    assert waiting._waits_for_notices(SimpleNamespace(__name__=name, __version__=version)) is listens
