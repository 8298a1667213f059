"""Counts said in words for people to read: "1 run", "2 runs", never "1 runs" or "run(s)"."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, the noun plural unless the count is exactly one (``plural`` for the
    nouns that do not take an "s": "history", "histories")."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
