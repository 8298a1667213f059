"""The modules of durable a dispatched step's result passes through until the run's next position
is committed, the next turn's replay included (``python -m tests.step_path`` lists them), held
where they are: a change that lengthens the step path fails here. The goal is at most 10 modules
and two climbs back up a layer, once one write plan carries every result; until then the
ceilings are today's counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
#: Today's (modules, climbs), by database: PostgreSQL writes a result with the next turn's
#: settle in statements of its own; elsewhere the replay core calls back into the turn.
CEILINGS = {"postgresql": (48, 2), "sqlite": (46, 5)}


def test_a_dispatched_steps_result_passes_through_no_more_modules_than_today():
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
    path = json.loads(done.stdout.strip().splitlines()[-1])
    modules, climbs = CEILINGS[connection.vendor]
    assert path["count"] <= modules, "\n".join(path["modules"])
    assert path["climbed"] <= climbs, "\n".join(path["climbs"])
