"""The ``@durable.entity`` decorator and the registry of entity classes.

An entity is a small durable object addressed by (name, key): a class with ``initial_state()``
and operation methods ``op(self, state, arg) -> result``. Decorating never touches the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .definitions import add_version
from .errors import InvalidInput

_VERSION = re.compile(r"^\d+(\.\d+)*$")
_OP = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

#: Methods of an entity class that are not operations.
NOT_OPS = frozenset({"initial_state"})


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True, eq=False)
class Entity:
    """A registered entity version: its class, its operations, and the queue its ops run on."""

    cls: type
    name: str
    version: str = "1"
    queue: str | None = None

    @property
    def ops(self) -> frozenset[str]:
        """The operation names: the class's public methods, ``initial_state`` aside."""
        return frozenset(
            attr
            for attr in dir(self.cls)
            if not attr.startswith("_") and attr not in NOT_OPS and callable(getattr(self.cls, attr))
        )

    def instance(self, key: str) -> Any:
        """A fresh object of the class for one application, knowing its name and key."""
        obj = self.cls()
        obj.entity_name, obj.entity_key = self.name, key
        return obj

    def initial_state(self, key: str) -> Any:
        return self.instance(key).initial_state()

    def method(self, obj: Any, op: str) -> Callable[[Any, Any], Any]:
        """The bound operation ``op`` of ``obj``; InvalidInput naming the known ones if none."""
        if op not in self.ops:
            known = ", ".join(sorted(self.ops)) or "none"
            raise InvalidInput(
                f"entity {self.name!r} (version {self.version}) has no operation {op!r} "
                f"(operations: {known})",
                details={"field": "op"},
            )
        method: Callable[[Any, Any], Any] = getattr(obj, op)
        return method

    def __repr__(self) -> str:
        return f"<durable.Entity {self.name}@{self.version}>"


class EntityRegistry:
    """Entity classes by (name, version)."""

    def __init__(self) -> None:
        self.entities: dict[str, dict[str, Entity]] = {}

    def add(self, entity: Entity) -> Entity:
        return add_version(
            self.entities, "entity", entity.name, entity.version, entity, lambda e: _origin(e.cls)
        )

    def get(self, name: str, version: str | None = None) -> Entity:
        """The entity ``name`` (its newest version unless ``version``); InvalidInput if unknown."""
        versions = self.entities.get(name) if isinstance(name, str) else None
        if not versions:
            known = ", ".join(sorted(self.entities)) or "none"
            raise InvalidInput(
                f"no entity is registered as {name!r} (registered: {known}); check the name and that "
                "the module defining it (an app's workflows.py) is imported",
                details={"field": "name"},
            )
        if version is None:
            return versions[max(versions, key=version_key)]
        if version not in versions:
            raise InvalidInput(f"entity {name!r} has no version {version!r}", details={"field": "version"})
        return versions[version]

    def newest_version(self, name: str) -> str | None:
        versions = self.entities.get(name)
        return max(versions, key=version_key) if versions else None


def _origin(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


registry = EntityRegistry()


def entity(name: str, *, version: str = "1", queue: str | None = None) -> Callable[[type], type]:
    """Declare a durable entity class under ``name``.

    Its ops run one at a time per key, in arrival order, each exactly once; a newer ``version``
    takes over the keys it writes (a worker with only older code leaves them alone).
    """
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidInput(f"@durable.entity() needs a name of 1 to 200 characters, got {name!r}")
    if not isinstance(version, str) or not _VERSION.match(version):
        raise InvalidInput(f'entity version must be dotted integers like "1" or "2.1", got {version!r}')
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise InvalidInput(f"@durable.entity(queue=...) must be a queue name, got {queue!r}")

    def register(cls: type) -> type:
        if not isinstance(cls, type):
            raise InvalidInput(f"@durable.entity({name!r}) decorates a class, got {cls!r}")
        if not callable(getattr(cls, "initial_state", None)):
            raise InvalidInput(
                f"entity class {cls.__qualname__} needs an initial_state(self) method returning "
                "the state of a key no op has touched yet"
            )
        definition = Entity(cls=cls, name=name, version=version, queue=queue)
        for op in definition.ops:
            if not _OP.match(op) or len(op) > 100:
                raise InvalidInput(
                    f"entity operation names are identifiers of at most 100 characters: {op!r}"
                )
        registry.add(definition)
        cls.durable_entity = definition  # type: ignore[attr-defined]
        return cls

    return register
