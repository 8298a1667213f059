"""One name per error code: every code durable raises or records is a member of
``durable.ErrorCode``, and no code is spelled as a string literal anywhere else in the package."""

from __future__ import annotations

import re

import durable
from durable.errors import ErrorCode
from tests.spelled import spelled

#: How a code is given or compared: ``"code": "x"``, ``code="x"``, ``default_code = "x"``,
#: ``.code == "x"``, ``.code = "x"``, ``error.get("code") == "x"``.
SPELLED = re.compile(
    r"""(["']code["']\s*:\s*|\bcode\s*=\s*|\.code\s*[!=]=\s*|get\(["']code["']\)\s*[!=]=\s*)["'][a-z_]+["']"""
)


def test_no_error_code_is_spelled_outside_the_enum() -> None:
    found = spelled(SPELLED)
    assert not found, "use durable.ErrorCode instead:\n" + "\n".join(found)


def test_the_check_sees_a_code_spelled_out() -> None:
    for line in ('{"code": "timeout"}', 'raise X(code="timeout")', 'if exc.code == "cancelled":'):
        assert SPELLED.search(line), line


def test_each_code_is_its_string_and_exported() -> None:
    assert durable.ErrorCode is ErrorCode
    assert ErrorCode.TIMEOUT == "timeout" and f"{ErrorCode.CANCELLED}" == "cancelled"
    values = [code.value for code in ErrorCode]
    assert len(values) == len(set(values))
    assert all(re.fullmatch(r"[a-z_]+", value) for value in values)


def test_every_error_class_default_code_is_a_member() -> None:
    classes = [getattr(durable, name) for name in durable.__all__]
    errors = [c for c in classes if isinstance(c, type) and issubclass(c, durable.DurableError)]
    coded = [c for c in errors if c.default_code is not None]
    assert coded and all(isinstance(c.default_code, ErrorCode) for c in coded)
