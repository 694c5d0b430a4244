"""The task registry: task name -> task, the lowest layer of the task machinery.

Tasks are found when pgqueue's AppConfig imports each installed app's ``tasks`` module
(``PGQUEUE["TASK_MODULES"]``), so a name enqueued from anywhere resolves in every process.
``@pgqueue.task`` (``pgqueue.decorators``) registers them here. The registry imports no
other part of pgqueue but its exceptions: the service layer looks tasks up here, so the
registry must never reach up into it (tests/test_layers.py holds that).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .exceptions import UnknownTask

Handler = Callable[[Any, Any], Any]

TASK_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}\Z")


@dataclass(frozen=True)
class RegisteredTask:
    """A registered task: its handler and the defaults its jobs get.

    ``pgqueue.Task``, which adds ``enqueue``, is the subclass users hold.
    """

    name: str
    func: Handler
    max_attempts: int | None = None
    queue: str | None = None
    priority: int | None = None
    timeout: float | None = None  # seconds per attempt (pgqueue.timeouts)
    #: Its jobs' concurrency key: text, or a function of the payload (None: no key).
    concurrency_key: str | Callable[[Any], str | None] | None = None
    key_max_running: int | None = None  # the cap per key (None: DEFAULT_KEY_MAX_RUNNING)
    #: Its ``pgqueue.retry.RetryPolicy`` (None: every error retried, the global backoff).
    retry: Any = None

    def __call__(self, payload: Any, job: Any) -> Any:
        return self.func(payload, job)


_registry: dict[str, RegisteredTask] = {}
#: Handlers of whole families of names, ``"<family>:<anything>"``, named at enqueue time (the
#: Django Tasks backend names each job ``"django.tasks:<function path>"``).
_families: dict[str, RegisteredTask] = {}


def register(task: RegisteredTask) -> None:
    """Make ``task`` the task of its name; refuse a name another function holds."""
    if not TASK_NAME_RE.match(task.name):
        raise ValueError(f"invalid task name {task.name!r}: use [A-Za-z0-9_.:-], 1..200")
    existing = _registry.get(task.name)
    if (
        existing is not None
        and existing.func is not task.func
        and not _same_function(existing.func, task.func)
    ):
        raise ValueError(
            f"task name {task.name!r} is already registered by "
            f"{existing.func.__module__}.{existing.func.__qualname__}"
        )
    _registry[task.name] = task


def _same_function(a: Handler, b: Handler) -> bool:
    # A module imported twice (reload, test collection) re-registers the same function.
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register_family(family: str, task: RegisteredTask) -> None:
    """Resolve every valid name ``"<family>:<rest>"`` to ``task``'s handler, under that name."""
    _families[family] = task


def get_task(name: str) -> RegisteredTask:
    registered = _registry.get(name)
    if registered is not None:
        return registered
    family, sep, rest = name.partition(":")
    if sep and rest and family in _families and TASK_NAME_RE.match(name):
        return replace(_families[family], name=name)
    raise UnknownTask(name)


def registered_tasks() -> dict[str, RegisteredTask]:
    return dict(_registry)


def served_names() -> list[str]:
    """Every name this process can run, sorted: the tasks, and each family as
    ``"<family>:*"`` (what a worker records in its registry row)."""
    return sorted([*_registry, *(f"{family}:*" for family in _families)])


def unregister(name: str) -> None:
    """Remove a task (for tests that register throwaway tasks)."""
    _registry.pop(name, None)
    _families.pop(name, None)
