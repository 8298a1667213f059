"""Durable's Django system checks (``manage.py check``): the DURABLE setting, declared steps and
workflows, and the Celery and database settings durable relies on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from . import conf

#: What Redis uses when the project sets no visibility_timeout.
REDIS_DEFAULT_VISIBILITY = timedelta(hours=1)


@checks.register("durable")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every bad DURABLE value (it falls back to its default) and a project without USE_TZ."""
    messages: list[checks.CheckMessage] = [
        checks.Error(
            f"DURABLE[{key!r}]: {message}",
            hint="Fix this key in the DURABLE setting.",
            id="durable.E001",
        )
        for key, message in conf.problems(conf.declared())
    ]
    if not getattr(django_settings, "USE_TZ", False):
        messages.append(
            checks.Error(
                "durable needs USE_TZ = True: timers and leases compare aware datetimes.",
                id="durable.E002",
            )
        )
    return messages


@checks.register("durable")
def check_name_lengths(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse, before any run is stored, step and workflow names and queues longer than the
    columns that hold them (the database would refuse the first run that reached them)."""
    from .definitions import registry
    from .models import Checkpoint, Run

    def length(model: Any, field: str) -> int:
        return int(model._meta.get_field(field).max_length)

    workflows = [w for versions in registry.workflows.values() for w in versions.values()]
    declared = [
        *(("step", s.name, "name", s.name, length(Checkpoint, "name")) for s in registry.steps.values()),
        *(
            ("step", s.name, "queue", s.queue or "", length(Checkpoint, "queue"))
            for s in registry.steps.values()
        ),
        *(("workflow", w.name, "name", w.name, length(Run, "workflow")) for w in workflows),
        *(("workflow", w.name, "queue", w.queue or "", length(Run, "queue")) for w in workflows),
    ]
    return [
        checks.Error(
            f"{kind} {name[:60]!r}…: its {what} is {len(value)} characters long; at most {limit} fit.",
            hint=f"Give the {kind} a shorter {what}.",
            id="durable.E003",
        )
        for kind, name, what, value, limit in declared
        if len(value) > limit
    ]


@checks.register("durable")
def check_remote_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse a step on a queue of REMOTE_QUEUES that declares what a remote worker cannot keep
    (``@durable.step(remote=True)`` refuses the same options at declaration)."""
    from .definitions import registry

    remote = set(conf.get().REMOTE_QUEUES)
    found = []
    for step in registry.steps.values():
        if step.remote or step.queue not in remote:
            continue
        options = ("local", "concurrency", "rate_limit", "input_schema", "output_schema")
        given = [option for option in options if getattr(step, option) not in (None, False)]
        if given:
            found.append(
                checks.Error(
                    f"step {step.name!r} is on queue {step.queue!r}, listed in REMOTE_QUEUES, but declares "
                    f"{', '.join(given)}, which a remote worker cannot keep.",
                    hint="Drop the option, or move the step to a queue durable's own workers consume.",
                    id="durable.E004",
                )
            )
    return found


@checks.register("durable")
def check_connection_reuse(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn when Celery keeps connections across tasks but Django never pings them: after a
    database restart, each worker process's first durable task would fail on a dead connection."""
    from celery import current_app

    alias = conf.get().DATABASE
    return connection_reuse_problems(
        current_app.conf.get("CELERY_DB_REUSE_MAX"), alias, django_settings.DATABASES[alias]
    )


def connection_reuse_problems(
    reuse_max: Any, alias: str, database: dict[str, Any]
) -> list[checks.CheckMessage]:
    """W003's rule as a function of its inputs: Celery's reuse setting and the database's."""
    if not reuse_max or database.get("CONN_HEALTH_CHECKS") or database.get("ENGINE", "").endswith("sqlite3"):
        return []
    return [
        checks.Warning(
            f"CELERY_DB_REUSE_MAX keeps database connections across tasks, but DATABASES[{alias!r}] has "
            "no CONN_HEALTH_CHECKS: after a database restart each worker process fails its first task.",
            hint="Set CONN_HEALTH_CHECKS = True on that database.",
            id="durable.W003",
        )
    ]


@checks.register("durable")
def check_visibility_timeout(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn when Redis would redeliver a step that is still running within its timeout."""
    from celery import current_app

    from .definitions import registry

    broker = str(current_app.conf.broker_url or "")
    if not broker.startswith(("redis://", "rediss://")):
        return []
    options = current_app.conf.broker_transport_options or {}
    visibility = timedelta(
        seconds=options.get("visibility_timeout", REDIS_DEFAULT_VISIBILITY.total_seconds())
    )
    timed = [(step.timeout, step) for step in registry.steps.values() if step.timeout is not None]
    if not timed:
        return []
    longest_timeout, longest = max(timed, key=lambda pair: pair[0])
    if longest_timeout < visibility:
        return []
    return [
        checks.Warning(
            f"Redis visibility_timeout ({visibility}) is not longer than step {longest.name!r}'s "
            f"timeout ({longest.timeout}): Redis would hand the running step to a second worker.",
            hint="Raise CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'] above the longest step timeout.",
            id="durable.W001",
        )
    ]


#: What Celery's accept_content may call pickle: by name or by content type.
PICKLE = {"pickle", "application/x-python-serialize"}


@checks.register("durable")
def check_pickle(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn when the workers accept pickled messages: durable never sends any, and a worker that
    accepts them runs whatever code a message forged on the broker carries."""
    from celery import current_app

    accepted = set(current_app.conf.accept_content or ()) | set(current_app.conf.result_accept_content or ())
    if not accepted & PICKLE:
        return []
    return [
        checks.Warning(
            "Celery accepts pickled messages (accept_content includes pickle): anyone who can write to "
            "the broker can run code on your workers. durable's own messages are always JSON.",
            hint='Set CELERY_ACCEPT_CONTENT = ["json"] unless a task of yours really needs pickle.',
            id="durable.W004",
        )
    ]
