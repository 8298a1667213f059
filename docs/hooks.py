"""Check that the API reference and ``durable.__all__`` agree, so ``mkdocs build --strict`` fails.

Every public name must have exactly one ``::: durable.<name>`` entry, and entries may name only
public names: private module paths move between releases, the names in ``__all__`` do not.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.api_reference")

_DIRECTIVE = re.compile(r"^:::\s+(\S+)", re.MULTILINE)
_documented: dict[str, str] = {}


def _public_names(root: Path) -> list[str]:
    tree = ast.parse((root / "durable" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("durable/__init__.py has no literal __all__ to check the API reference against")


def on_pre_build(config: Any) -> None:
    _documented.clear()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for target in _DIRECTIVE.findall(markdown):
        where = page.file.src_uri
        if target in _documented:
            log.warning(f"{target} is documented twice: in {_documented[target]} and {where}")
        _documented[target] = where
    return markdown


def on_post_build(config: Any) -> None:
    public = {f"durable.{name}" for name in _public_names(Path(config.config_file_path).parent)}
    for target in sorted(set(_documented) - public):
        log.warning(
            f"{_documented[target]} documents {target}, which is not in durable.__all__: "
            "document the public name (durable.<name>) instead"
        )
    for target in sorted(public - set(_documented)):
        log.warning(f"{target} is public (durable.__all__) but has no '::: {target}' entry in docs/api/")
