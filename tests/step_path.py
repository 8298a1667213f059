"""Which of durable's modules a dispatched step's result passes through, from the task that
receives it (``durable.run_step``) to the commit of the run's next position, in order.

    python -m tests.step_path            # on the embedded default (SQLite), in a folder of its own
    DATABASE_URL=postgres://... python -m tests.step_path

It runs in a process of its own: a tracer in a process with other threads (a test session's)
can stall them. The process is a worker of every queue that runs no step in place (as the test
harness is), so the result's worker runs the next turn inline, as a Celery worker does. It prints
one line per module entered, in order, then the summary as JSON on the last line: the modules,
how many there are, and how many times the path climbed back up a layer (a call from a module
into one of a layer above it, as DESIGN.md orders them).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
from typing import Any

#: DESIGN.md's layers above the vocabulary (and the settings, clock and instruments every layer
#: reads), lowest first; a module's layer is that of the longest prefix it has, else 0.
LAYERS = (
    (),
    ("durable.replay",),
    ("durable.models",),
    ("durable.engine", "durable.dispatch", "durable.reads", "durable.waiting"),
    ("durable.tasks", "durable.api", "durable.results", "durable.calls", "durable.celery"),
)


def layer(module: str) -> int:
    found = (0, 0)
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > found[1]:
                found = (level, len(prefix))
    return found[0]


def trace(call: Any) -> dict[str, Any]:
    """Run ``call`` under a profiler; the modules of durable it entered, in order, and the climbs."""
    entered: list[str] = []
    climbs: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("durable.") or module.startswith("durable.testing"):
            return
        if module not in entered:
            entered.append(module)
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        if caller.startswith("durable.") and layer(module) > layer(caller):
            climbs.append(f"{caller} -> {module}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return {"modules": entered, "count": len(entered), "climbs": climbs, "climbed": len(climbs)}


def main() -> None:
    if not os.environ.get("DATABASE_URL"):  # a SQLite file of its own, whoever started it
        own = tempfile.mkdtemp(prefix="durable-step-path-")
        atexit.register(shutil.rmtree, own, ignore_errors=True)
        os.environ["DURABLE_VAR_DIR"] = own
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor == "postgresql":
        name = f"durable_step_path_{os.getpid()}"
        connection.settings_dict["NAME"] = "postgres"  # DATABASE_URL's own may not exist
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        connection.close()
        connection.settings_dict["NAME"] = name
    call_command("migrate", verbosity=0)
    try:
        print(json.dumps(_measure()))
    finally:
        if connection.vendor == "postgresql":
            connection.close()
            connection.settings_dict["NAME"] = "postgres"
            with connection.cursor() as cursor:
                cursor.execute(f"DROP DATABASE {name}")


def _measure() -> dict[str, Any]:
    import durable
    from durable import dispatch
    from durable.engine import steps, turn

    sent: list[dispatch.Message] = []
    dispatch.install(
        dispatch.Transport(send=sent.append, served_queues=None, may_wait=False, keep_alive=False)
    )

    @durable.step(name="step_path.first")
    def first() -> int:
        return 1

    @durable.step(name="step_path.second")
    def second(value: int) -> int:
        return value + 1

    @durable.workflow(name="step_path.flow")
    def flow(ctx: Any, _: Any) -> int:
        return ctx.step(second, ctx.step(first))

    run = durable.start(flow)
    for message in list(sent):  # the first turn sends the first step
        if message.task == "durable.advance":
            turn.advance(message.args[0])
    message = next(m for m in sent if m.task == "durable.run_step")
    sent.clear()
    path = trace(lambda: steps.run_step(*message.args))
    for module in path["modules"]:
        print(module, file=sys.stderr)
    assert any(m.task == "durable.run_step" for m in sent), "the next position was not sent"
    path["run"] = run.id
    return path


if __name__ == "__main__":
    main()
