"""``QueueRouter``: pgqueue's models live in ``PGQUEUE["DATABASE"]``, and only they do.

Add it to ``DATABASE_ROUTERS`` when the queue has a database of its own::

    DATABASES = {"default": {...}, "queue": {...}}
    DATABASE_ROUTERS = ["pgqueue.router.QueueRouter"]
    PGQUEUE = {"DATABASE": "queue"}

It is not installed behind the project's back: routers are the project's, read once, in
its order, and one that routes pgqueue's models itself should win. pgqueue's own code passes
the alias explicitly everywhere (``using``); the router is what makes the rest agree with
it: ``migrate`` (pgqueue's tables only on the queue's alias, nothing else there), the
admin's querysets and saves, and a project's own ``Job.objects`` queries. With the
setting left at ``"default"`` it has no opinion on anything. ``manage.py check`` reports a
queue alias that is missing, not PostgreSQL, or not routed to (pgqueue.E030-E032).
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from .conf import pgqueue_settings

APP_LABEL = "pgqueue"


def _alias() -> str:
    return pgqueue_settings.DATABASE


class QueueRouter:
    """Routes pgqueue's models to ``PGQUEUE["DATABASE"]``; keeps other apps off it."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        return _alias() if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: type, **hints: Any) -> str | None:
        return _alias() if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        """Between pgqueue's models, yes; across the two databases, no."""
        ours = [o._meta.app_label == APP_LABEL for o in (obj1, obj2)]
        if all(ours):
            return True
        if any(ours) and _alias() != DEFAULT_DB_ALIAS:
            return False
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        alias = _alias()
        if alias == DEFAULT_DB_ALIAS:
            return None
        if app_label == APP_LABEL:
            return db == alias
        return False if db == alias else None
