"""The modules of durable a dispatched step's result passes through until the run's next position
is committed (``python -m tests.step_path`` lists them), held where they are: a change that
lengthens the step path fails here. Two views: the modules the result itself goes through (the
goal is at most 10, with at most two calls up a layer), and every module the ``run_step`` call
enters (its lease keeping, instruments and publish included); the ceilings are today's counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
#: Today's (modules, climbs) of the result's own path, by database. PostgreSQL writes the result
#: with the next turn in one statement; elsewhere the result is written, then read back by the
#: turn that runs next (the rows, the history's records, the codecs' envelope check).
RESULT_CEILINGS = {"postgresql": (10, 0), "sqlite": (12, 0)}
#: Today's (modules, climbs) of every module the call enters. Elsewhere than on PostgreSQL the
#: replay core calls back into the turn for signals and runs.
ENTERED_CEILINGS = {"postgresql": (45, 2), "sqlite": (43, 5)}


@pytest.fixture(scope="module")
def path() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.step_path"],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def test_a_dispatched_steps_result_goes_through_no_more_modules_than_today(path):
    result = path["result_path"]
    modules, climbs = RESULT_CEILINGS[connection.vendor]
    assert result["count"] <= modules, "\n".join(result["modules"])
    assert result["climbed"] <= climbs, "\n".join(result["climbs"])
    # The path starts where the step's body returns and ends at the rows that store the result.
    assert result["modules"][0] == "durable.replay.attempt"
    assert "durable.models.payloads" in result["modules"]


def test_the_step_message_enters_no_more_modules_than_today(path):
    modules, climbs = ENTERED_CEILINGS[connection.vendor]
    assert path["count"] <= modules, "\n".join(path["modules"])
    assert path["climbed"] <= climbs, "\n".join(path["climbs"])
