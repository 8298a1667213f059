"""The lower bound of each dependency in pyproject.toml is the version CI installs in its lowest
run (.ci/lowest.txt, constraints for .ci/wheel), so a bound the package states is one that was
tested; every dependency has a lower bound, and requirements.txt pins a version within range."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {}).values()
    return [Requirement(line) for line in [*project["dependencies"], *(d for group in extras for d in group)]]


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line.strip())
        if match:
            pins[canonicalize_name(match[1])] = Version(match[3])
    return pins


def _lower_bound(requirement: Requirement) -> Version:
    (bound,) = [spec for spec in requirement.specifier if spec.operator == ">="]
    return Version(bound.version)


def test_every_dependency_states_a_lower_bound() -> None:
    unbounded = [str(req) for req in _declared() if not any(s.operator == ">=" for s in req.specifier)]
    assert unbounded == []


def test_ci_installs_each_lower_bound() -> None:
    lowest = _pins(ROOT / ".ci" / "lowest.txt")
    wrong = {
        req.name: (str(_lower_bound(req)), str(lowest.get(canonicalize_name(req.name))))
        for req in _declared()
        if lowest.get(canonicalize_name(req.name)) != _lower_bound(req)
    }
    assert wrong == {}, "bound in pyproject.toml vs pin in .ci/lowest.txt"


def test_the_pinned_requirements_are_within_the_ranges() -> None:
    pinned = _pins(ROOT / "requirements.txt")
    outside = [
        f"{req.name}=={pinned[canonicalize_name(req.name)]} not in {req.specifier}"
        for req in _declared()
        if canonicalize_name(req.name) in pinned and pinned[canonicalize_name(req.name)] not in req.specifier
    ]
    assert outside == []
