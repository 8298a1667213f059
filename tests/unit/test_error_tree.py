"""The exception tree drawn at the top of errors.py is complete."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import durable
from durable import errors


def _exceptions() -> set[type[BaseException]]:
    found = set()
    for module in pkgutil.walk_packages(durable.__path__, "durable."):
        if ".migrations" in module.name or ".management" in module.name:
            continue
        for value in vars(importlib.import_module(module.name)).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith("durable")
            ):
                found.add(value)
    return found


def test_the_tree_in_errors_docstring_names_every_exception_of_durable_and_where_it_lives() -> None:
    tree = errors.__doc__ or ""
    classes = _exceptions()
    assert {cls.__name__ for cls in classes} >= {
        "ContinueAsNew",
        "Interrupted",
        "LeaseLost",
        "_Stale",
        "Suspend",
    }
    for cls in classes:
        line = next((line for line in tree.splitlines() if f"── {cls.__name__} " in line), None)
        assert line is not None, f"{cls.__name__} is missing from the tree in errors.py"
        if cls.__module__ != "durable.errors":
            assert cls.__module__ in line, f"the tree does not say {cls.__name__} lives in {cls.__module__}"
