"""pgqueue: a durable, multi-tenant, fairly scheduled job queue for Django on PostgreSQL.

Public API::

    import pgqueue

    @pgqueue.task(name="word_count", max_attempts=5)
    def word_count(payload, job): ...

    job, created = pgqueue.enqueue("word_count", {"text": "hi"}, tenant="acme")
    count = job.wait(timeout=30)  # or pgqueue.result(job.id, timeout=30), once committed
    ids = pgqueue.enqueue_many("word_count", [{"text": "a"}, {"text": "b"}], tenant="acme")

Delivery is at-least-once; a job's completion is recorded exactly once (fenced by lease
owner and attempt number). Handlers must therefore be idempotent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .decorators import Task, task
from .exceptions import (
    InvalidJob,
    InvalidTransition,
    JobCancelled,
    JobFailed,
    JobNotCommitted,
    JobNotFound,
    JobTimedOut,
    PayloadTooLarge,
    PermanentError,
    PgQueueError,
    ResultTimeout,
    Retry,
    TooManyQueues,
    UnknownTask,
    UpstreamTooLarge,
)
from .registry import get_task
from .retry import Backoff
from .schedules import periodic

if TYPE_CHECKING:
    from .services import Enqueued

__all__ = [
    "Backoff",
    "InvalidJob",
    "InvalidTransition",
    "JobCancelled",
    "JobFailed",
    "JobNotCommitted",
    "JobNotFound",
    "JobTimedOut",
    "PayloadTooLarge",
    "PermanentError",
    "PgQueueError",
    "ResultTimeout",
    "Retry",
    "Task",
    "TooManyQueues",
    "UnknownTask",
    "UpstreamTooLarge",
    "Workflow",
    "chain",
    "chord",
    "enqueue",
    "enqueue_many",
    "get_task",
    "group",
    "periodic",
    "result",
    "step",
    "task",
]


def enqueue(
    task: Task | str,
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
    """Enqueue one job in the current transaction of ``using``; returns ``(job, created)``.

    A rollback of the caller's transaction leaves no job. Options left at None take the
    task's defaults (``@pgqueue.task(queue=..., priority=..., max_attempts=...)``), then the
    ``PGQUEUE`` settings'.

    :param task: a ``@pgqueue.task`` function or a registered task name.
    :param payload: any JSON-serialisable value (default ``None``).
    :param tenant: whose job it is, ``[A-Za-z0-9_.-]{1,64}``; default ``DEFAULT_TENANT``.
    :param queue: the queue it waits in; default the task's, then ``DEFAULT_QUEUE``.
    :param priority: -100..100, higher runs first; default the task's, then 0.
    :param delay: seconds (or a timedelta) to wait before it may run; not with ``run_at``.
    :param run_at: the moment it may run, timezone-aware (naive is refused); not with ``delay``.
    :param idempotency_key: unique per tenant; a second enqueue with the same key returns
        the first job and ``created=False``.
    :param max_attempts: 1..100 attempts before it is dead; default the task's, then
        ``DEFAULT_MAX_ATTEMPTS``.
    :param timeout: seconds (or a timedelta) one attempt may run, counted from its
        handler's start; default the task's, then ``DEFAULT_TIMEOUT_SECONDS`` (None: none).
    :param concurrency_key: at most ``key_max_running`` jobs of this key (text of 1..128
        characters, e.g. ``"user:42"``) hold a slot at once, across every worker; or a
        function of the payload giving one. Default the task's (None: no key).
    :param key_max_running: the key's cap, 1..10,000; 1 runs the key's jobs one at a time
        in enqueue order (a sequence). Default the task's, then ``DEFAULT_KEY_MAX_RUNNING``.
    :param depends_on: jobs of the tenant (``Job`` objects or ids) this one waits for: it
        is 'waiting' until they have all ended, then runs (``pgqueue.Workflow`` builds
        whole graphs). At most ``MAX_DEPENDENCIES``.
    :param on_upstream_failure: ``"cancel"`` (default): cancelled when a dependency ends
        dead or cancelled; ``"run"``: runs once all have ended, whatever their outcome.
    :param using: the database alias.
    """
    from .services import enqueue as _enqueue

    return _enqueue(
        task,
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
    task: Task | str,
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
    """Enqueue one job per payload, all or none, and return their ids in order.

    One statement per 1,000 payloads, in one transaction; the options (as for
    ``enqueue``, but without an idempotency key, which names one job) apply to every job;
    ``concurrency_key`` may also be a list of one key (or None) per payload, or a
    function of the payload: each job then has its own key. ``depends_on`` and
    ``on_upstream_failure``: every job waits for those jobs, as with ``enqueue``.
    """
    from .services import enqueue_many as _enqueue_many

    return _enqueue_many(
        task,
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


#: Names served from ``pgqueue.workflows`` on first use: that module reads the models,
#: which cannot be imported while Django loads its apps (and this package with them).
_WORKFLOW_NAMES = ("Workflow", "chain", "chord", "group", "step")


def __getattr__(name: str) -> Any:
    if name in _WORKFLOW_NAMES:
        from . import workflows

        return getattr(workflows, name)
    raise AttributeError(f"module 'pgqueue' has no attribute {name!r}")


def result(
    job_id: int, timeout: float | dt.timedelta | None = None, *, using: str | None = None
) -> Any:
    """Wait for the job ``job_id`` to end and return its result (what its handler
    returned); ``job.wait(timeout)`` does the same for a ``Job``.

    Woken by PostgreSQL (LISTEN/NOTIFY) the moment the job's end commits, not by polling.
    Wait only for a committed job: from inside the transaction that enqueued it, no worker
    can see it, and ``JobNotCommitted`` is raised at once.

    :param timeout: seconds (or a timedelta) to wait at most; None: as long as it takes.
    :param using: the database alias of the queue.
    :raises JobFailed: the job ended ``dead`` or ``cancelled`` (``.status``,
        ``.last_error``, ``.job_id``). A failure that will be retried does not end it.
    :raises ResultTimeout: a ``TimeoutError``: not ended within ``timeout``.
    :raises JobNotFound: no such job.
    :raises JobNotCommitted: the job is in the caller's open transaction.
    """
    from .results import result as _result

    return _result(job_id, timeout, using=using)
