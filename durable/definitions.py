"""The ``@durable.workflow`` and ``@durable.step`` decorators, retry policies and the registry.

Decorators never touch the database: they only build definitions and register them here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from . import guards
from .annotated import shaped, signature
from .cron import Schedule, schedule_option
from .durations import optional_duration
from .errors import DurableError, ErrorCode, InvalidInput, WorkflowNotRegistered
from .limits import Concurrency, Lane, Rate, Singleton, claim_lane, concurrency_option, lane_option
from .retries import Retry
from .values import decode, register_annotations

_VERSION = re.compile(r"^\d+(\.\d+)*$")


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _no_app_label(module: str) -> str | None:
    return None


#: Maps a module to the label of the installed app that contains it, or None. The app config
#: installs Django's lookup (``durable.apps``); outside Django names fall back to the module.
app_label_of: Callable[[str], str | None] = _no_app_label


def _default_name(fn: Callable[..., Any]) -> str:
    module = fn.__module__
    label = app_label_of(module)
    return f"{label}.{fn.__name__}" if label else f"{module}.{fn.__name__}"


#: The workflow whose body runs in this context now (set by the replay core around the body,
#: cleared by a step's scope): a step function called directly there would run on every replay.
_in_body: ContextVar[str | None] = ContextVar("durable_workflow_body", default=None)


@contextlib.contextmanager
def body_scope(workflow: str | None) -> Iterator[None]:
    """Mark the code inside as the body of ``workflow`` (None: not a workflow body)."""
    token = _in_body.set(workflow)
    try:
        yield
    finally:
        _in_body.reset(token)


@dataclass(eq=False)
class Step:
    """A registered step; calling it outside a workflow just calls the function."""

    fn: Callable[..., Any]
    name: str
    queue: str | None = None
    local: bool = False
    retry: Retry = field(default_factory=Retry)
    timeout: timedelta | None = None
    heartbeat_timeout: timedelta | None = None
    #: At most ``limit`` attempts in flight across the fleet (per key); see ``Concurrency``.
    concurrency: Concurrency | None = None
    #: At most ``rate.count`` starts per ``rate.period`` across the fleet (``rate_limit="100/m"``).
    rate_limit: Rate | None = None
    #: The shared lane whose limits these are (its gates named after it, not the step).
    lane: Lane | None = None
    input_schema: Any = None
    output_schema: Any = None
    compensate: Callable[..., Any] | None = None
    #: An existing Celery task used as a step: sent with ``send_task`` under its own name.
    celery_task: bool = False
    #: Run by a worker that may have no database: sent under the step's name with its input, its
    #: result and heartbeats come back as ``durable.step_result`` / ``durable.heartbeat``.
    remote: bool = False

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        workflow = _in_body.get()
        if workflow is not None:
            # Replayed from the top on every turn, the call would repeat its side effect each time.
            raise DurableError(
                f"step {self.name!r} was called directly inside workflow {workflow!r}, so it would run "
                f"again on every replay: use ctx.step({self.fn.__name__}, ...)",
                code=ErrorCode.STEP_CALLED_DIRECTLY,
            )
        return self.fn(*args, **kwargs)

    @property
    def limited(self) -> bool:
        """Whether a fleet-wide limit bounds this step's attempts (so none runs in place)."""
        return self.concurrency is not None or self.rate_limit is not None

    def compensation(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register the saga undo of this step, called with the step's output and its args."""
        self.compensate = fn
        return fn

    def __repr__(self) -> str:
        return f"<durable.Step {self.name}>"


@dataclass(eq=False)
class Workflow:
    """A registered workflow version."""

    fn: Callable[..., Any]
    name: str
    version: str = "1"
    queue: str | None = None
    timeout: timedelta | None = None
    input_schema: Any = None
    validate_input: Callable[[Any], Any] | None = None
    singleton: Singleton | None = None
    on_error: dict[str, Any] | None = None
    dead_letter: Any = None
    tags: tuple[str, ...] = ()
    search_attributes_schema: Any = None
    schedule: Schedule | None = None
    validators: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    #: ``concurrency=`` as declared; enforced through ``singleton`` (the same line of runs).
    concurrency: Concurrency | None = None
    #: The lane its runs wait in (its key scoped by the lane, not the workflow; see ``singletons``).
    lane: Lane | None = None
    #: Its turns run on a worker of ``queue`` that may have no database (see ``durable.remote``).
    remote: bool = False

    def __post_init__(self) -> None:
        functools.update_wrapper(self, self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    #: ``durable.start``, installed by the API (``durable.api``) so that this layer needs none
    #: of the layers above it.
    starter: ClassVar[Callable[..., Any] | None] = None

    def start(self, input: Any = None, **kwargs: Any) -> Any:
        """Start a run of exactly this version (``durable.start(self, input, ...)``)."""
        if Workflow.starter is None:
            raise RuntimeError("durable.api is not imported yet: import durable before starting runs")
        return Workflow.starter(self, input, **kwargs)

    def body_input(self, stored: Any) -> Any:
        """A stored input as the body receives it, parsed by ``input_schema`` on every turn;
        ``InvalidInput`` when it no longer fits (the schema changed under a running run)."""
        value = decode(stored)  # tagged JSON: a Decimal or a datetime the run was started with
        if self.input_schema is None:
            return shaped(value, signature(self.fn).parameter(1))
        try:
            return self.input_schema.model_validate(value)
        except Exception as exc:  # noqa: BLE001 - whatever the schema library raises
            raise InvalidInput(f"the input of run no longer fits {self.name}'s input_schema: {exc}") from None

    def check_input(self, stored: Any) -> None:
        """Refuse, with ``InvalidInput``, an input this workflow's ``input_schema`` or
        ``validate_input`` refuses: before a run of it is stored, whoever starts it."""
        value = decode(stored)
        if self.input_schema is not None:
            try:
                self.input_schema.model_validate(value)
            except Exception as exc:  # noqa: BLE001 - whatever the schema library raises
                raise InvalidInput(
                    f"the input does not fit workflow {self.name!r}'s input_schema: {exc}"
                ) from exc
        if self.validate_input is not None:
            try:
                self.validate_input(value)
            except Exception as exc:  # noqa: BLE001 - the validator's refusal, whatever its type
                raise InvalidInput(f"workflow {self.name!r} refused its input: {exc}") from exc

    def validator(self, update_name: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
        """Register ``fn(payload)`` to vet ``durable.update(run_id, update_name, payload)``: it
        raises to refuse the update, before anything is stored."""
        if not isinstance(update_name, str) or not update_name:
            raise InvalidInput(f"@{self.name}.validator() needs the update's name, got {update_name!r}")

        def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            if not callable(fn):
                raise InvalidInput(
                    f"@{self.name}.validator({update_name!r}) decorates a function, got {fn!r}"
                )
            self.validators[update_name] = fn
            return fn

        return register

    def __repr__(self) -> str:
        return f"<durable.Workflow {self.name}@{self.version}>"


def _search_schema_option(schema: Any) -> dict[str, Any] | None:
    """``search_attributes_schema``: attribute names to str, int, float or bool (or a tuple of them)."""
    if schema is None:
        return None
    allowed = (str, int, float, bool)
    ok = isinstance(schema, dict) and all(
        isinstance(name, str)
        and name
        and all(kind in allowed for kind in (kinds if isinstance(kinds, tuple) else (kinds,)))
        for name, kinds in schema.items()
    )
    if not ok:
        raise InvalidInput(
            "search_attributes_schema maps attribute names to str, int, float or bool (or a tuple of them), "
            f'e.g. {{"customer": str, "cents": int}}; got {schema!r}'
        )
    return dict(schema)


class Registry:
    """Workflows by (name, version) and steps by name."""

    def __init__(self) -> None:
        self.workflows: dict[str, dict[str, Workflow]] = {}
        self.steps: dict[str, Step] = {}

    def add_workflow(self, wf: Workflow) -> Workflow:
        return add_version(self.workflows, "workflow", wf.name, wf.version, wf, lambda w: _origin(w.fn))

    def add_step(self, step: Step) -> Step:
        existing = self.steps.get(step.name)
        if existing is not None and _origin(existing.fn) != _origin(step.fn):
            raise InvalidInput(
                f"step {step.name!r} is already registered by {_origin(existing.fn)}; "
                "pass name= to tell them apart"
            )
        self.steps[step.name] = step
        return step

    def workflow(self, name: str, version: str | None = None) -> Workflow:
        versions = self.workflows.get(name)
        if not versions:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise WorkflowNotRegistered(
                f"no workflow is registered as {name!r} (registered: {known}); check the name "
                "and that its workflows.py is in an app listed in INSTALLED_APPS"
            )
        if version is None:
            return versions[max(versions, key=version_key)]
        if version not in versions:
            raise WorkflowNotRegistered(
                f"workflow {name!r} has no version {version!r} "
                f"(registered: {', '.join(sorted(versions, key=version_key))})"
            )
        return versions[version]

    def step(self, name: str) -> Step:
        if name.startswith(COMPENSATE_PREFIX):
            return compensation_of(self.step(name[len(COMPENSATE_PREFIX) :]))
        try:
            return self.steps[name]
        except KeyError:
            raise WorkflowNotRegistered(
                f"no step is registered as {name!r}; is the module that defines it imported "
                "by the worker (an app's workflows.py)?"
            ) from None

    def remote_turn_queues(self) -> set[str]:
        """The queues of the workflows declared ``remote=True``: their turns go to remote workers."""
        return {
            wf.queue
            for versions in self.workflows.values()
            for wf in versions.values()
            if wf.remote and wf.queue
        }

    def known_step(self, name: str) -> Step | None:
        """The step (or compensation) registered as ``name``; None when there is none."""
        try:
            return self.step(name)
        except WorkflowNotRegistered:
            return None


COMPENSATE_PREFIX = "compensate:"


def celery_task_step(task: Any) -> Step:
    """A step that sends an existing Celery task (a ``celery.Task`` or a task name).

    The task keeps its own retry settings: durable records the final result only, once.
    """
    name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"ctx.step() takes a @durable.step, a Celery task or a task name, got {task!r}")

    def _not_here(*args: Any, **kwargs: Any) -> Any:
        raise InvalidInput(f"{name} is a Celery task: durable sends it, it does not call it")

    _not_here.__name__ = name.rpartition(".")[2]
    queue = None if isinstance(task, str) else getattr(task, "queue", None)
    return Step(fn=_not_here, name=name, queue=queue, retry=Retry(max_attempts=1), celery_task=True)


def plain_task_refused(name: str) -> DurableError:
    """Why a Celery task cannot be a step under a codec: its worker knows nothing of durable, so
    its arguments and result would cross the broker in the clear."""
    return DurableError(
        f'{name} is a Celery task used as a step, and DURABLE["CODEC"] is set: its worker knows '
        "nothing of durable, so its arguments and result would cross the broker unencoded. Make it "
        "a @durable.step(remote=True) served by durable.remote.serve() (or by a worker that opens "
        "and seals payloads, like examples/remote_worker), or leave CODEC off",
        code=ErrorCode.PLAIN_TASK_UNDER_CODEC,
    )


def compensation_of(step: Step) -> Step:
    """The saga undo of ``step`` as a step of its own, with the step's retry policy and queue."""
    if step.compensate is None:
        raise WorkflowNotRegistered(f"step {step.name!r} has no @{step.name}.compensation registered")
    return Step(
        fn=step.compensate,
        name=f"{COMPENSATE_PREFIX}{step.name}",
        queue=step.queue,
        local=step.local,
        retry=step.retry,
        timeout=step.timeout,
        heartbeat_timeout=step.heartbeat_timeout,
        remote=step.remote,
    )


def _origin(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def add_version(
    table: dict[str, dict[str, Any]],
    kind: str,
    name: str,
    version: str,
    new: Any,
    origin: Callable[[Any], str],
) -> Any:
    """Register ``new`` as version ``version`` of ``name`` (a workflow, an entity); the same
    version defined at another ``origin`` is refused (importing a module twice is not)."""
    versions = table.setdefault(name, {})
    existing = versions.get(version)
    if existing is not None and origin(existing) != origin(new):
        raise InvalidInput(
            f"{kind} {name!r} version {version!r} is already registered by {origin(existing)}; "
            "give this one another name or version"
        )
    versions[version] = new
    return new


registry = Registry()


def _duration_option(value: Any, what: str) -> timedelta | None:
    try:
        return optional_duration(value, what=what)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _schema_option(schema: Any, option: str, fn: Callable[..., Any]) -> None:
    if schema is not None and not callable(getattr(schema, "model_validate", None)):
        raise InvalidInput(
            f"{option}= of {fn.__name__!r} takes a pydantic model (or anything with model_validate), got {schema!r}"
        )


def _parameters(fn: Callable[..., Any]) -> int:
    """How many arguments the function takes: its parameters, bar ``*args`` / ``**kwargs``."""
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return sum(p.kind not in kinds for p in inspect.signature(fn).parameters.values())


def step(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str | None = None,
    local: bool = False,
    retry: Retry | None = None,
    timeout: Any = None,
    heartbeat_timeout: Any = None,
    concurrency: Any = None,
    rate_limit: str | None = None,
    input_schema: Any = None,
    output_schema: Any = None,
    remote: bool = False,
    lane: Lane | None = None,
) -> Any:
    """Declare a step; works with or without parentheses."""

    def wrap(func: Callable[..., Any]) -> Step:
        if retry is not None and not isinstance(retry, Retry):
            raise InvalidInput(f"step retry= must be a durable.Retry, got {retry!r}")
        if not isinstance(remote, bool):
            raise InvalidInput(f"step remote= must be True or False, got {remote!r}")
        if remote:
            _remote_options(
                name or _default_name(func),
                local,
                queue,
                concurrency,
                rate_limit,
                input_schema,
                output_schema,
                lane,
            )
        limit = concurrency_option(concurrency, f"step {func.__name__!r} concurrency=")
        rate = Rate.parse(rate_limit, f"step {func.__name__!r} rate_limit=")
        shared = lane_option(lane, f"step {func.__name__!r} lane=")
        if shared is not None and (limit is not None or rate is not None):
            raise InvalidInput(
                f"step {func.__name__!r} takes lane= or its own concurrency= / rate_limit=, not both: "
                "put the limits in the Lane"
            )
        if shared is not None:
            limit, rate = shared.slots, shared.rate_limit
        if local and (limit is not None or rate is not None):
            raise InvalidInput(
                f"step {func.__name__!r} is local=True, which runs inside the workflow's turn, so "
                "concurrency=, rate_limit= and lane= cannot hold it back: drop local=True or the limit"
            )
        _schema_option(input_schema, "input_schema", func)
        _schema_option(output_schema, "output_schema", func)
        if input_schema is not None and _parameters(func) != 1:
            raise InvalidInput(
                f"step {func.__name__!r} declares input_schema=, which validates the step's one argument, "
                f"but it takes {_parameters(func)}: take one argument (a model of them all) or drop input_schema"
            )
        guards.step_function(func)
        register_annotations(func)  # the classes its arguments and result come back as
        added = registry.add_step(
            Step(
                fn=func,
                name=name or _default_name(func),
                queue=queue,
                local=local,
                retry=retry or Retry(),
                timeout=_duration_option(timeout, "step timeout"),
                heartbeat_timeout=_duration_option(heartbeat_timeout, "step heartbeat_timeout"),
                concurrency=limit,
                rate_limit=rate,
                lane=shared,
                input_schema=input_schema,
                output_schema=output_schema,
                remote=remote,
            )
        )
        claim_lane(shared, "steps")
        return added

    return wrap(fn) if fn is not None else wrap


def _remote_options(name: str, local: bool, queue: str | None, *unenforced: Any) -> None:
    """Refuse what a remote step cannot keep: it runs where durable does not, so nothing there
    could hold it to a fleet-wide limit or check its schemas, and a local step never leaves the turn."""
    if local:
        raise InvalidInput(
            f"step {name!r}: remote=True runs it on another worker and local=True inside the turn; pick one"
        )
    if not queue:
        # On durable's own queue, durable's workers would take a message only a remote one can run.
        raise InvalidInput(
            f'step {name!r} is remote=True: name the queue its remote workers consume, e.g. queue="gpu"'
        )
    given = [
        option
        for option, value in zip(
            ("concurrency", "rate_limit", "input_schema", "output_schema", "lane"), unenforced, strict=True
        )
        if value is not None
    ]
    if given:
        raise InvalidInput(
            f"step {name!r} is remote=True: its worker runs without durable, so {', '.join(given)}= "
            "cannot be enforced there; drop the option or make the step a durable one (remote=False)"
        )


def workflow(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    queue: str | None = None,
    timeout: Any = None,
    input_schema: Any = None,
    validate_input: Callable[[Any], Any] | None = None,
    singleton: Any = None,
    on_error: dict[str, Any] | None = None,
    dead_letter: Any = None,
    tags: tuple[str, ...] | list[str] = (),
    search_attributes_schema: Any = None,
    schedule: Any = None,
    concurrency: Any = None,
    remote: bool = False,
    lane: Lane | None = None,
) -> Any:
    """Declare a workflow; works with or without parentheses."""
    if not isinstance(version, str) or not _VERSION.match(version):
        raise InvalidInput(f'workflow version must be dotted integers like "1" or "2.1", got {version!r}')
    if not isinstance(remote, bool):
        raise InvalidInput(f"workflow remote= must be True or False, got {remote!r}")
    if remote and not (isinstance(queue, str) and queue):
        # durable's own workers consume the default queue: they would take turns meant for remote ones.
        raise InvalidInput(
            'a remote=True workflow runs its turns on remote workers: name the queue they consume, e.g. queue="edge"'
        )

    def wrap(func: Callable[..., Any]) -> Workflow:
        guards.not_async_generator(func, "workflow")
        register_annotations(func)  # the classes its input and output come back as
        added = registry.add_workflow(
            Workflow(
                fn=func,
                name=name or _default_name(func),
                version=version,
                queue=queue,
                timeout=_duration_option(timeout, "workflow timeout"),
                input_schema=input_schema,
                validate_input=validate_input,
                singleton=singleton,
                on_error=on_error,
                dead_letter=dead_letter,
                tags=tuple(tags),
                search_attributes_schema=search_schema,
                schedule=declared,
                concurrency=quota,
                remote=remote,
                lane=shared,
            )
        )
        claim_lane(shared, "runs")
        return added

    declared = schedule_option(schedule)
    if singleton is not None and not isinstance(singleton, Singleton):
        raise InvalidInput(f"singleton= takes a durable.Singleton(key=..., limit=...), got {singleton!r}")
    quota = concurrency_option(concurrency, "workflow concurrency=")
    if quota is not None:
        if singleton is not None:
            raise InvalidInput(
                "a workflow takes singleton= or concurrency=, not both: concurrency=N is "
                "Singleton(key=..., limit=N) over the input, so put the limit in the Singleton"
            )
        # The same line as a singleton's: runs wait pending and are admitted in start order.
        singleton = Singleton(key=quota.key if quota.key is not None else "*", limit=quota.limit)
    shared = lane_option(lane, "workflow lane=", member="runs")
    if shared is not None and singleton is not None:
        raise InvalidInput(
            "a workflow takes one of singleton=, concurrency= and lane=: put the limit in the Lane"
        )
    search_schema = _search_schema_option(search_attributes_schema)
    return wrap(fn) if fn is not None else wrap
