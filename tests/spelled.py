"""Where a pattern is spelled in the package's own sources (not its migrations): the checks that
keep one name per error code and per state, and no server-side cursor."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def spelled(pattern: re.Pattern[str], *, skip: tuple[str, ...] = ()) -> list[str]:
    """``path:line: text`` of every line of durable/ and durable_admin/ (migrations and the files
    named in ``skip`` left out) that ``pattern`` finds."""
    found = []
    for package in ("durable", "durable_admin"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path.name in skip:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found
