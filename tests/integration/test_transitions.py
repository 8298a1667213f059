"""The transition tables: every status move the suite makes is one they name (the test database
refuses any other, see ``tests/transitions.py``), their statement names are durable's own, and
only the row modules move a status."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import DatabaseError, transaction

import durable
from durable.models import Checkpoint, Run
from durable.statuses import CHECKPOINT_MOVES, RUN_MOVES, CheckpointStatus, RunStatus
from tests.transitions import forging

pytestmark = pytest.mark.django_db

PACKAGE = Path(durable.__file__).parent


@durable.step(name="tests.transitions.step")
def a_step():
    return "done"


@durable.workflow(name="tests.transitions.flow")
def flow(ctx, _):
    return ctx.step(a_step)


def test_a_move_the_tables_do_not_name_is_refused_by_the_database(durable_env):
    run = durable.start(flow)
    assert (RunStatus.PENDING, RunStatus.COMPLETED) not in RUN_MOVES
    with pytest.raises(DatabaseError, match="does not name"), transaction.atomic():
        Run.objects.filter(id=run.id).update(status=RunStatus.COMPLETED)
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING
    durable_env.run_until_idle()
    assert durable.result(run.id) == "done"
    with pytest.raises(DatabaseError, match="does not name"), transaction.atomic():
        Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)  # an end never comes back


def test_a_test_may_forge_a_state_on_purpose(durable_env):
    run = durable.start(flow)
    durable_env.run_until_idle()
    with forging():
        Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING)
    assert Run.objects.get(id=run.id).status == RunStatus.RUNNING
    with pytest.raises(DatabaseError, match="does not name"), transaction.atomic():
        Checkpoint.objects.filter(run_id=run.id, seq=0).update(status=CheckpointStatus.FAILED)  # past forging


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_statement_the_tables_name_is_one_of_the_row_modules():
    defined = set().union(*(_functions(path) for path in (PACKAGE / "models").glob("*.py")))
    for moves in (RUN_MOVES, CHECKPOINT_MOVES):
        for move, names in moves.items():
            assert names, move
            assert set(names) <= defined, (move, sorted(set(names) - defined))


def _status_updates(path: Path) -> list[int]:
    """Lines of ``.update(status=...)`` calls in ``path``."""
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "update"
        and any(keyword.arg == "status" for keyword in node.keywords)
    ]


def test_only_the_row_modules_move_a_status():
    outside = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.is_relative_to(PACKAGE / "models") and not path.is_relative_to(PACKAGE / "migrations")
        for line in _status_updates(path)
    ]
    assert not outside, "move a status in a method of durable/models/, named in durable/statuses.py"
