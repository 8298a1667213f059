"""The messages durable exchanges with workers that may not run durable, as JSON Schemas.

``v1/`` holds one schema per message; ``schema(name)`` reads one. The files are the contract a
worker in another language implements (see docs/remote-workers.md); the tests validate the
messages durable sends and accepts against them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

#: The protocol versions this durable speaks; a message names its version in ``protocol``.
VERSIONS = (1,)
HERE = Path(__file__).parent


@cache
def schema(name: str, version: int = 1) -> dict[str, Any]:
    """The JSON Schema of message ``name`` (``attempt``, ``step_message``, ``step_result``,
    ``heartbeat``, ``turn``, ``decision``, ``turn_heartbeat``, ``record``, ``envelope``) in protocol
    ``version``."""
    return json.loads((HERE / f"v{version}" / f"{name}.json").read_text())
