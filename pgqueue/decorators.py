"""``@pgqueue.task`` and the :class:`Task` it returns, whose ``enqueue`` calls the services.

This module sits above the service layer, which sits above the registry: a task can
enqueue itself without the registry, where the services look tasks up, importing them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .registry import Handler, RegisteredTask, register
from .retry import Backoff, BackoffFunction, policy

if TYPE_CHECKING:
    from .services import Enqueued


@dataclass(frozen=True)
class Task(RegisteredTask):
    """A task as ``@pgqueue.task`` returns it: callable as its handler, and enqueueable."""

    # The services import models, which the app registry must be ready for; this module is
    # imported with the ``pgqueue`` package, before that: hence the imports in the methods.
    def enqueue(
        self,
        payload: Any = None,
        *,
        tenant: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        timeout: float | dt.timedelta | None = None,
        concurrency_key: str | Callable[[Any], str | None] | None = None,
        key_max_running: int | None = None,
        depends_on: Iterable[Any] | None = None,
        on_upstream_failure: str = "cancel",
        using: str | None = None,
    ) -> Enqueued:
        """Enqueue one job of this task: ``pgqueue.enqueue(this task, payload, ...)``,
        whose docstring describes each option. Returns ``(job, created)``."""
        from .services import enqueue

        return enqueue(
            self,
            payload,
            tenant=tenant,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            timeout=timeout,
            concurrency_key=concurrency_key,
            key_max_running=key_max_running,
            depends_on=depends_on,
            on_upstream_failure=on_upstream_failure,
            using=using,
        )

    def enqueue_many(
        self,
        payloads: Iterable[Any],
        *,
        tenant: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | dt.timedelta | None = None,
        run_at: dt.datetime | None = None,
        max_attempts: int | None = None,
        timeout: float | dt.timedelta | None = None,
        concurrency_key: str | Sequence[str | None] | Callable[[Any], str | None] | None = None,
        key_max_running: int | None = None,
        depends_on: Iterable[Any] | None = None,
        on_upstream_failure: str = "cancel",
        using: str | None = None,
    ) -> list[int]:
        """Enqueue one job of this task per payload: ``pgqueue.enqueue_many(this task,
        payloads, ...)``. Returns the ids in order."""
        from .services import enqueue_many

        return enqueue_many(
            self,
            payloads,
            tenant=tenant,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            timeout=timeout,
            concurrency_key=concurrency_key,
            key_max_running=key_max_running,
            depends_on=depends_on,
            on_upstream_failure=on_upstream_failure,
            using=using,
        )


def task(
    name: str | None = None,
    *,
    max_attempts: int | None = None,
    queue: str | None = None,
    priority: int | None = None,
    timeout: float | dt.timedelta | None = None,
    concurrency_key: str | Callable[[Any], str | None] | None = None,
    key_max_running: int | None = None,
    retry_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    discard_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    backoff: Backoff | BackoffFunction | None = None,
) -> Callable[[Handler], Task]:
    """Register ``func(payload, job)`` as a task.

    ``name`` defaults to ``module.function``. The options are defaults for the task's jobs;
    an enqueue call may override each of them. ``timeout`` is the seconds one attempt may
    run (``pgqueue.timeouts``), above 0 and at most ``PGQUEUE["MAX_TIMEOUT_SECONDS"]``:
    checked here, so a bad value fails at import rather than at the first enqueue.
    ``concurrency_key`` (text, or a function of the payload giving text or None) and
    ``key_max_running`` cap the task's jobs per key (``pgqueue.enqueue`` says how), and
    are checked here too.

    The retry policy (``pgqueue.retry``): ``retry_on`` (exception classes) retries only
    those, any other error ends the job dead at once; ``discard_on`` ends it dead at once
    on those (it wins over ``retry_on``); ``backoff`` is a ``pgqueue.Backoff(base, cap,
    jitter)`` or a function ``(attempt, error) -> seconds`` for the wait before the next
    attempt. Unset, every error is retried with the global backoff. ``PermanentError``
    always ends the job, and ``raise pgqueue.Retry(in_=...)`` always snoozes it.
    """
    from .key_models import KEY_MAX_LENGTH, KEY_MAX_RUNNING_BOUND
    from .timeouts import validate_timeout

    seconds = validate_timeout(timeout)
    retry = policy(retry_on, discard_on, backoff)
    fixed_key = concurrency_key is not None and not callable(concurrency_key)
    if fixed_key and not (
        isinstance(concurrency_key, str) and 1 <= len(concurrency_key) <= KEY_MAX_LENGTH
    ):
        raise ValueError(f"concurrency_key must be text of 1 to {KEY_MAX_LENGTH} characters")
    if key_max_running is not None and (
        isinstance(key_max_running, bool)
        or not isinstance(key_max_running, int)
        or not 1 <= key_max_running <= KEY_MAX_RUNNING_BOUND
    ):
        raise ValueError(f"key_max_running must be an integer 1..{KEY_MAX_RUNNING_BOUND}")

    def decorate(func: Handler) -> Task:
        registered = Task(
            name or f"{func.__module__}.{func.__qualname__}",
            func,
            max_attempts,
            queue,
            priority,
            seconds,
            concurrency_key,
            key_max_running,
            retry,
        )
        register(registered)
        return registered

    return decorate
