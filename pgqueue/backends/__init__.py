"""A backend for Django's Tasks framework: ``@task`` functions run as pgqueue jobs.

::

    TASKS = {
        "default": {
            "BACKEND": "pgqueue.backends.PgQueueBackend",
            "QUEUES": ["default", "emails"],       # optional; [] allows any queue name
            "OPTIONS": {"TENANT": "acme", "MAX_ATTEMPTS": 3},  # optional
        }
    }

``task.enqueue(*args, **kwargs)`` writes one ordinary pgqueue job, in the caller's
transaction (``pgqueue.enqueue``: a rollback leaves nothing, and no worker is woken):

- its ``task`` is ``"django.tasks:<module path of the function>"``, so the admin, the HTTP
  API, the logs and the per-task metrics say which function it runs (``"django.tasks"`` alone
  for a path that cannot be a pgqueue task name, over 187 characters say);
- its payload is ``{"task": <module path>, "backend": <TASKS alias>, "args": [...],
  "kwargs": {...}, "enqueued_at": <ISO time>}`` (and ``"run_after"`` when given);
- its queue, priority (-100..100, unchanged) and ``run_at`` are the task's ``queue_name``,
  ``priority`` and ``run_after``; its tenant and max attempts come from ``OPTIONS``.

The result id is the job id. ``runworker`` runs the jobs through one pgqueue handler,
registered here for the whole ``django.tasks:`` family of names; pgqueue's AppConfig imports
this package wherever ``TASKS`` names the backend, so the workers' settings must name it too.

``OPTIONS``:

- ``TENANT``: the tenant of every job (default ``PGQUEUE["DEFAULT_TENANT"]``); or
- ``TENANT_CALLABLE``: a callable, or its dotted path, ``(task, args, kwargs) -> tenant``,
  called at each enqueue with the JSON-normalised arguments;
- ``MAX_ATTEMPTS``: 1..100 (default ``PGQUEUE["DEFAULT_MAX_ATTEMPTS"]``). A failed attempt
  is retried after pgqueue's backoff, which is global: ``PGQUEUE["BACKOFF_BASE"]`` and
  ``["BACKOFF_CAP"]``, not a per-backend option.

The modules, each importing only those listed before it:

- ``framework``: the framework's names, from Django 6 or the django-tasks backport;
- ``options``: the ``TASKS`` entry, its system check and the backend's base class;
- ``results``: a job and its attempt history as a ``TaskResult``;
- ``runner``: the handler of the ``django.tasks`` family, and the signals of a run;
- ``backend``: ``PgQueueBackend`` itself.
"""

from __future__ import annotations

import django  # noqa: F401  (django.VERSION says which framework the names come from)

from .backend import PgQueueBackend
from .framework import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from .options import OPTION_NAMES, check_tasks_backends, config_problems
from .results import FAMILY, STATUSES, LeaseExpired
from .runner import RUNNER

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "FAMILY",
    "OPTION_NAMES",
    "RUNNER",
    "STATUSES",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "LeaseExpired",
    "PgQueueBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "check_tasks_backends",
    "config_problems",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
