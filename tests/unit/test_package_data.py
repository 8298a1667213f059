"""The wheel ships every file durable needs: each file under durable/ and durable_admin/ that is
not Python matches a package-data pattern in pyproject.toml (so a new template, static file or
schema cannot be left out of the wheel while every test passes on the checkout).

Nothing is built here: the patterns are expanded as setuptools expands them (recursive globs
relative to the package's folder). CI's wheel suite (.ci/wheel) checks the built wheel itself.
"""

from __future__ import annotations

import glob
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("durable", "durable_admin")


def _package_data() -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-data"]


def _shipped_data_files() -> set[Path]:
    shipped: set[Path] = set()
    for package, patterns in _package_data().items():
        folder = ROOT / package.replace(".", "/")
        for pattern in patterns:
            matches = glob.glob(str(folder / pattern), recursive=True)
            shipped.update(Path(match) for match in matches if Path(match).is_file())
    return shipped


def _data_files_on_disk() -> set[Path]:
    found: set[Path] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".py", ".pyc"):
                found.add(path)
    return found


def test_every_non_python_file_of_the_packages_is_package_data() -> None:
    missing = sorted(str(path.relative_to(ROOT)) for path in _data_files_on_disk() - _shipped_data_files())
    assert missing == [], f"add a pattern to [tool.setuptools.package-data] in pyproject.toml for: {missing}"


def test_the_files_durable_reads_at_run_time_are_covered() -> None:
    shipped = {str(path.relative_to(ROOT)) for path in _shipped_data_files()}
    assert "durable/py.typed" in shipped
    assert any(name.startswith("durable/protocol/v1/") and name.endswith(".json") for name in shipped)
    assert any(name.startswith("durable_admin/templates/") for name in shipped)
    assert any(name.startswith("durable_admin/static/") for name in shipped)


def test_every_package_folder_is_a_package_so_find_includes_it() -> None:
    # A folder of .py files without __init__.py is left out by packages.find: its modules
    # (a migration, a management command) would be missing from the wheel.
    missing = sorted(
        str(folder.relative_to(ROOT))
        for package in PACKAGES
        for folder in [ROOT / package, *(ROOT / package).rglob("*")]
        if folder.is_dir()
        and any(child.suffix == ".py" for child in folder.iterdir())
        and not (folder / "__init__.py").exists()
    )
    assert missing == []
