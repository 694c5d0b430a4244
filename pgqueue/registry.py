"""The task registry: ``@pgqueue.task`` and lookup by name.

Tasks are found when pgqueue's AppConfig imports each installed app's ``tasks`` module
(``PGQUEUE["TASK_MODULES"]``), so a name enqueued from anywhere resolves in every process.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .exceptions import UnknownTask

Handler = Callable[[Any, Any], Any]

TASK_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


@dataclass(frozen=True)
class Task:
    """A registered task: its handler and the defaults its jobs get."""

    name: str
    func: Handler
    max_attempts: int | None = None
    queue: str | None = None
    priority: int | None = None

    def __call__(self, payload: Any, job: Any) -> Any:
        return self.func(payload, job)

    def enqueue(self, payload: Any = None, **options: Any) -> Any:
        """``pgqueue.enqueue(this task, payload, **options)``."""
        from .services import enqueue

        return enqueue(self, payload, **options)

    def enqueue_many(self, payloads: Any, **options: Any) -> Any:
        from .services import enqueue_many

        return enqueue_many(self, payloads, **options)


_registry: dict[str, Task] = {}
#: Handlers of whole families of names, ``"<family>:<anything>"``, named at enqueue time (the
#: Django Tasks backend names each job ``"django.tasks:<function path>"``).
_families: dict[str, Task] = {}


def task(
    name: str | None = None,
    *,
    max_attempts: int | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> Callable[[Handler], Task]:
    """Register ``func(payload, job)`` as a task.

    ``name`` defaults to ``module.function``. The options are defaults for the task's jobs;
    an enqueue call may override each of them.
    """

    def register(func: Handler) -> Task:
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        if not TASK_NAME_RE.match(task_name):
            raise ValueError(f"invalid task name {task_name!r}: use [A-Za-z0-9_.:-], 1..200")
        existing = _registry.get(task_name)
        if (
            existing is not None
            and existing.func is not func
            and not _same_function(existing.func, func)
        ):
            raise ValueError(
                f"task name {task_name!r} is already registered by "
                f"{existing.func.__module__}.{existing.func.__qualname__}"
            )
        registered = Task(task_name, func, max_attempts, queue, priority)
        _registry[task_name] = registered
        return registered

    return register


def _same_function(a: Handler, b: Handler) -> bool:
    # A module imported twice (reload, test collection) re-registers the same function.
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register_family(family: str, task: Task) -> None:
    """Resolve every valid name ``"<family>:<rest>"`` to ``task``'s handler, under that name."""
    _families[family] = task


def get_task(name: str) -> Task:
    registered = _registry.get(name)
    if registered is not None:
        return registered
    family, sep, rest = name.partition(":")
    if sep and rest and family in _families and TASK_NAME_RE.match(name):
        return replace(_families[family], name=name)
    raise UnknownTask(name)


def registered_tasks() -> dict[str, Task]:
    return dict(_registry)


def unregister(name: str) -> None:
    """Remove a task (for tests that register throwaway tasks)."""
    _registry.pop(name, None)
    _families.pop(name, None)
