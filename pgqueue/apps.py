from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import autodiscover_modules

#: The ``TASKS`` backend of Django's Tasks framework that pgqueue provides.
TASKS_BACKEND = "pgqueue.backends.PgQueueBackend"


class PgQueueConfig(AppConfig):
    name = "pgqueue"
    verbose_name = "pgqueue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .conf import pgqueue_settings

        # Every installed app's tasks.py registers its @pgqueue.task functions, so a task
        # name resolves the same way in the web process and in every worker.
        autodiscover_modules(*pgqueue_settings.TASK_MODULES)

        # The Tasks framework backend registers the handler that runs its tasks (and its
        # system check) only where TASKS uses it: the framework is an optional extra.
        tasks = getattr(settings, "TASKS", None)
        if isinstance(tasks, dict) and any(
            isinstance(c, dict) and c.get("BACKEND") == TASKS_BACKEND for c in tasks.values()
        ):
            from . import backends  # noqa: F401
