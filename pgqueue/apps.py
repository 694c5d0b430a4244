from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


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
