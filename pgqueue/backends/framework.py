"""The names pgqueue takes from Django's Tasks framework: Django 6's ``django.tasks``, or on
Django 5.2 the django-tasks backport, which spells two exceptions differently.

Every other module of the backend imports them from here, so the choice is made once.
"""

from __future__ import annotations

import django
from django.core.exceptions import ImproperlyConfigured

if django.VERSION >= (6, 0):
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:  # pragma: no cover - depends on the Django version
    try:
        from django_tasks import DEFAULT_TASK_QUEUE_NAME, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImproperlyConfigured(
            "pgqueue.backends.PgQueueBackend needs Django's Tasks framework: Django 6, or on "
            "Django 5.2 the django-tasks backport: pip install 'django-tasks>=0.12' (the "
            "'tasks' extra of django-pgqueue-fair)."
        ) from exc

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
