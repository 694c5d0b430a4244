"""pgqueue: a durable, multi-tenant, fairly scheduled job queue for Django on PostgreSQL.

Public API::

    import pgqueue

    @pgqueue.task(name="word_count", max_attempts=5)
    def word_count(payload, job): ...

    job, created = pgqueue.enqueue("word_count", {"text": "hi"}, tenant="acme")
    ids = pgqueue.enqueue_many("word_count", [{"text": "a"}, {"text": "b"}], tenant="acme")

Delivery is at-least-once; a job's completion is recorded exactly once (fenced by lease
owner and attempt number). Handlers must therefore be idempotent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .decorators import Task, task
from .exceptions import (
    InvalidJob,
    InvalidTransition,
    JobNotFound,
    PayloadTooLarge,
    PermanentError,
    PgQueueError,
    UnknownTask,
)
from .registry import get_task
from .schedules import periodic

if TYPE_CHECKING:
    from .services import Enqueued

__all__ = [
    "InvalidJob",
    "InvalidTransition",
    "JobNotFound",
    "PayloadTooLarge",
    "PermanentError",
    "PgQueueError",
    "Task",
    "UnknownTask",
    "enqueue",
    "enqueue_many",
    "get_task",
    "periodic",
    "task",
]


def enqueue(task: Task | str, payload: Any = None, **options: Any) -> Enqueued:
    """Enqueue one job; see ``pgqueue.services.enqueue``. Returns ``(job, created)``."""
    from .services import enqueue as _enqueue

    return _enqueue(task, payload, **options)


def enqueue_many(task: Task | str, payloads: Any, **options: Any) -> list[int]:
    """Enqueue one job per payload in one statement per 1,000; see ``services.enqueue_many``."""
    from .services import enqueue_many as _enqueue_many

    return _enqueue_many(task, payloads, **options)
