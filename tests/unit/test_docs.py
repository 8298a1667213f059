"""The README is a short front door whose links land, and each generated block of the docs has one home.

The site itself is checked by ``mkdocs build --strict`` (in ``.ci/run``); these checks need no
docs packages: the README's length and relative links, its two commands, and the markers between
which the bench scripts write their tables into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MARKER = re.compile(r"<!-- (\w+:[\w-]+) -->")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_the_readme_is_a_front_door_of_at_most_300_lines() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_the_readme_s_relative_links_point_at_files_that_exist() -> None:
    missing = []
    for target in _LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (ROOT / path).exists():
            missing.append(target)
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_readme_keeps_its_two_commands() -> None:
    text = README.read_text()
    setup = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt"
    assert f"{setup} && .venv/bin/python manage.py shop_demo" in text
    assert f"{setup} && .venv/bin/pytest" in text


def test_no_marker_is_used_twice() -> None:
    """A marker names one block: used twice, whatever reads it takes one block for the other."""
    seen: Counter[str] = Counter()
    for page in _pages():
        seen.update(_MARKER.findall(page.read_text()))
    assert [name for name, count in seen.items() if count > 1] == []


def test_every_table_a_bench_script_writes_has_its_markers_in_the_benchmarks_page() -> None:
    written = set()
    for script in (ROOT / "bench").glob("*.py"):
        written.update(re.findall(r'update_tables\(\s*"([\w-]+)"', script.read_text()))
    assert written >= {"suite", "fans", "entities", "flow", "result", "scale"}
    assert report.TABLES == DOCS / "benchmarks.md"
    text = report.TABLES.read_text()
    for name in written:
        assert text.count(f"<!-- bench:{name} -->") == 1, name
        assert text.count(f"<!-- /bench:{name} -->") == 1, name
    assert "<!-- bench:" not in README.read_text()


def test_update_tables_replaces_only_its_block(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(
        "intro\n<!-- bench:flow -->\nold\n<!-- /bench:flow -->\n<!-- bench:scale -->\nkept\n<!-- /bench:scale -->\n"
    )
    assert report.update_tables("flow", "| new |\n", page)
    assert page.read_text() == (
        "intro\n<!-- bench:flow -->\n| new |\n<!-- /bench:flow -->\n<!-- bench:scale -->\nkept\n<!-- /bench:scale -->\n"
    )
    assert not report.update_tables("suite", "x", page)
