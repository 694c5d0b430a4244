"""``@pgqueue.task`` and the :class:`Task` it returns, whose ``enqueue`` calls the services.

This module sits above the service layer, which sits above the registry: a task can
enqueue itself without the registry, where the services look tasks up, importing them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .registry import Handler, RegisteredTask, register

if TYPE_CHECKING:
    from .services import Enqueued


@dataclass(frozen=True)
class Task(RegisteredTask):
    """A task as ``@pgqueue.task`` returns it: callable as its handler, and enqueueable."""

    # The services import models, which the app registry must be ready for; this module is
    # imported with the ``pgqueue`` package, before that: hence the imports in the methods.
    def enqueue(self, payload: Any = None, **options: Any) -> Enqueued:
        """``pgqueue.enqueue(this task, payload, **options)``."""
        from .services import enqueue

        return enqueue(self, payload, **options)

    def enqueue_many(self, payloads: Any, **options: Any) -> list[int]:
        """``pgqueue.enqueue_many(this task, payloads, **options)``."""
        from .services import enqueue_many

        return enqueue_many(self, payloads, **options)


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

    def decorate(func: Handler) -> Task:
        registered = Task(
            name or f"{func.__module__}.{func.__qualname__}", func, max_attempts, queue, priority
        )
        register(registered)
        return registered

    return decorate
