"""Which of durable's modules a dispatched step's result passes through, from the task that
receives it (``durable.run_step``) to the commit of the run's next position, in order.

    python -m tests.step_path            # on the embedded default (SQLite), in a folder of its own
    DATABASE_URL=postgres://... python -m tests.step_path

Two views of one step, each on a run of its own:

- **the result's path**: the modules the step's result itself goes through. The step returns a
  string no other code holds; a module is on the path when one of its functions is called with
  the result (or the result as stored: tagged, encoded, inside a row, a record or a list that
  holds it directly), or gets it back from a call. The path ends with the commit of the last
  statement that writes it (the result, and the next position whose input it is).
- **every module entered**: all the modules the ``run_step`` call enters until it returns, the
  lease keeping, the instruments and the publish of the next step included.

It runs in a process of its own: a tracer in a process with other threads (a test session's)
can stall them. The process is a worker of every queue that runs no step in place (as the test
harness is), so the result's worker runs the next turn inline, as a Celery worker does. It prints
each view's modules, in order, then the summary as JSON on the last line: for each view the
modules, how many there are, and how many times the path climbed back up a layer (a call from a
module into one of a layer above it, as DESIGN.md orders them).
"""

from __future__ import annotations

import atexit
import inspect
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
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


#: The step's result: a string only the step returns, so any value that holds it came from it.
RESULT = f"step-path-result-{uuid.uuid4().hex}"


def holds(value: Any, depth: int = 1) -> bool:
    """Whether ``value`` is the result as some form of it (a string or bytes that contain it),
    or, ``depth`` levels down, a collection or an object whose items or attributes are."""
    if isinstance(value, str):
        return RESULT in value
    if isinstance(value, (bytes, bytearray)):
        return RESULT.encode() in value
    if depth == 0 or value is None or isinstance(value, (int, float, bool)):
        return False
    if isinstance(value, dict):
        return any(holds(item, depth - 1) for item in list(value.values())[:100])
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(holds(item, depth - 1) for item in list(value)[:100])
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return any(holds(item, depth - 1) for item in list(attributes.values())[:100])
    # A slotted wrapper (psycopg's Jsonb, say): its slots, wherever in its classes they are.
    slots = [name for kind in type(value).__mro__ for name in getattr(kind, "__slots__", ())]
    return any(holds(getattr(value, name, None), depth - 1) for name in slots if isinstance(name, str))


def _durable(module: str) -> bool:
    return module.startswith("durable.") and not module.startswith("durable.testing")


def follow(call: Callable[[], Any], database: str) -> dict[str, Any]:
    """Run ``call`` under a profiler; the modules of durable the result passes through until the
    last statement that writes it commits, in order, and the calls that passed it up a layer."""
    from django.db import connections, transaction

    entered: list[str] = []
    climbs: list[str] = []
    #: How many modules were on the path at each commit of a write that holds the result.
    commits: list[int] = []

    def enter(module: str, caller: str | None) -> None:
        if module not in entered:
            entered.append(module)
        if caller is not None and _durable(caller) and layer(module) > layer(caller):
            climbs.append(f"{caller} -> {module}")

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "return":
            # The caller gets the result back: it handles it too.
            back = frame.f_back
            caller = back.f_globals.get("__name__", "") if back is not None else ""
            if _durable(caller) and caller not in entered and holds(arg):
                enter(caller, None)  # a return, not a call: going back up is no climb
            return
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not _durable(module):
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
        arguments = [frame.f_locals.get(name) for name in code.co_varnames[:count]]
        if any(holds(argument) for argument in arguments):
            back = frame.f_back
            enter(module, back.f_globals.get("__name__", "") if back is not None else "")

    connection = connections[database]

    def committed() -> None:
        commits.append(len(entered))

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        done = execute(sql, params, many, context)
        if holds(params, depth=4):
            if connection.in_atomic_block:
                transaction.on_commit(committed, using=database)
            else:
                committed()
        return done

    sys.setprofile(profile)
    try:
        with connection.execute_wrapper(watch):
            call()
    finally:
        sys.setprofile(None)
    assert commits, "no statement that writes the result was seen to commit"
    path = entered[: commits[-1]]
    kept = [climb for climb in climbs if climb.split(" -> ")[1] in path]
    return {"modules": path, "count": len(path), "climbs": kept, "climbed": len(kept)}


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
    from durable import conf, dispatch
    from durable.engine import steps, turn

    sent: list[dispatch.Message] = []
    dispatch.install(
        dispatch.Transport(send=sent.append, served_queues=None, may_wait=False, keep_alive=False)
    )

    @durable.step(name="step_path.first")
    def first() -> str:
        return RESULT

    @durable.step(name="step_path.second")
    def second(value: str) -> int:
        return len(value)

    @durable.workflow(name="step_path.flow")
    def flow(ctx: Any, _: Any) -> int:
        return ctx.step(second, ctx.step(first))

    def first_step() -> dispatch.Message:
        """A new run's first step, sent by its first turn: its message, nothing else left sent."""
        sent.clear()
        durable.start(flow)
        for message in list(sent):
            if message.task == "durable.advance":
                turn.advance(message.args[0])
        message = next(m for m in sent if m.task == "durable.run_step")
        sent.clear()
        return message

    def next_sent() -> None:
        assert any(m.task == "durable.run_step" for m in sent), "the next position was not sent"

    message = first_step()
    result_path = follow(lambda: steps.run_step(*message.args), conf.get().DATABASE)
    next_sent()
    message = first_step()
    path = trace(lambda: steps.run_step(*message.args))
    next_sent()
    print("the result's path:", *result_path["modules"], sep="\n  ", file=sys.stderr)
    print("every module entered:", *path["modules"], sep="\n  ", file=sys.stderr)
    return {**path, "result_path": result_path}


if __name__ == "__main__":
    main()
