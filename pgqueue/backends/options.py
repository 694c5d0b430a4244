"""What a ``TASKS`` entry of pgqueue's backend may say, checked at start-up and read once.

The system check and the backend share one list of problems (:func:`config_problems`), so
a setting the check accepts is one the backend accepts. :class:`ConfiguredBackend`, the
base of ``PgQueueBackend``, is what the check and the runner recognise as pgqueue's
backend: they need not import the backend class, which sits above them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string

from .. import services
from ..exceptions import InvalidJob
from .framework import DEFAULT_TASK_QUEUE_NAME, BaseTaskBackend, InvalidTaskBackend

#: The documented ``BACKEND`` path (the package re-exports the class).
BACKEND_PATH = "pgqueue.backends.PgQueueBackend"
#: The ``OPTIONS`` the backend understands.
OPTION_NAMES = ("TENANT", "TENANT_CALLABLE", "MAX_ATTEMPTS")


@dataclasses.dataclass(frozen=True)
class _Options:
    tenant: str | None
    tenant_callable: Callable[..., Any] | None
    max_attempts: int | None


def _option_problems(options: Any) -> list[tuple[str, str]]:
    """``(check id, message)`` for each problem of an ``OPTIONS`` value."""
    if not isinstance(options, dict):
        return [("pgqueue.E102", f"OPTIONS must be a dict, got {options!r}.")]
    problems: list[tuple[str, str]] = []
    unknown = sorted(str(k) for k in set(options) - set(OPTION_NAMES))
    if unknown:
        message = f"unknown OPTIONS {', '.join(unknown)}; known: {', '.join(OPTION_NAMES)}."
        if any("BACKOFF" in k.upper() for k in unknown):
            message += (
                " Retry backoff is global to pgqueue: set PGQUEUE['BACKOFF_BASE'] and "
                "PGQUEUE['BACKOFF_CAP']."
            )
        problems.append(("pgqueue.E102", message))
    if "TENANT" in options and "TENANT_CALLABLE" in options:
        problems.append(("pgqueue.E103", "give OPTIONS TENANT or TENANT_CALLABLE, not both."))
    if "TENANT" in options:
        try:
            services.validate_name(options["TENANT"], "tenant")
        except InvalidJob as exc:
            problems.append(
                ("pgqueue.E103", f"OPTIONS['TENANT'] {options['TENANT']!r}: {exc.reason}.")
            )
    if "TENANT_CALLABLE" in options:
        try:
            _callable(options["TENANT_CALLABLE"])
        except (ImportError, TypeError) as exc:
            problems.append(("pgqueue.E103", f"OPTIONS['TENANT_CALLABLE']: {exc}"))
    if options.get("MAX_ATTEMPTS") is not None:
        try:
            services.validate_max_attempts(options["MAX_ATTEMPTS"])
        except InvalidJob as exc:
            problems.append(("pgqueue.E104", f"OPTIONS['MAX_ATTEMPTS']: {exc.reason}."))
    return problems


def _queue_problems(queues: Any) -> list[tuple[str, str]]:
    if isinstance(queues, str) or not isinstance(queues, list | tuple | set | frozenset):
        return [("pgqueue.E101", f"QUEUES must be a list of queue names, got {queues!r}.")]
    return [
        (
            "pgqueue.E101",
            f"QUEUES names {q!r}, which is not a valid pgqueue queue name "
            "([A-Za-z0-9_.-]{1,64}).",
        )
        for q in queues
        if not isinstance(q, str) or not services.NAME_RE.match(q)
    ]


def _callable(value: Any) -> Callable[..., Any]:
    func = import_string(value) if isinstance(value, str) else value
    if not callable(func):
        raise TypeError(f"{value!r} is not callable")
    return func


def config_problems(params: dict[str, Any]) -> list[tuple[str, str]]:
    """Every problem of one ``TASKS`` entry that names this backend."""
    return [
        *_queue_problems(params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])),
        *_option_problems(params.get("OPTIONS", {})),
    ]


class ConfiguredBackend(BaseTaskBackend):
    """A Tasks backend configured by a pgqueue ``TASKS`` entry: ``PgQueueBackend``'s base."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Lenient: a bad OPTIONS is reported by the system check, and refused at enqueue.
        super().__init__(alias, params)
        self.params = params
        self._options: _Options | None = None

    @property
    def pgqueue_options(self) -> _Options:
        if self._options is None:
            problems = config_problems(self.params)
            if problems:
                raise InvalidTaskBackend(
                    f"TASKS[{self.alias!r}]: " + " ".join(message for _, message in problems)
                )
            options = self.params.get("OPTIONS", {})
            tenant_callable = options.get("TENANT_CALLABLE")
            self._options = _Options(
                tenant=options.get("TENANT"),
                tenant_callable=None if tenant_callable is None else _callable(tenant_callable),
                max_attempts=options.get("MAX_ATTEMPTS"),
            )
        return self._options


def _uses_this_backend(path: Any) -> bool:
    if path == BACKEND_PATH:
        return True
    if not isinstance(path, str):
        return False
    try:
        cls = import_string(path)
    except ImportError:
        return False  # the framework reports a backend it cannot import
    return isinstance(cls, type) and issubclass(cls, ConfiguredBackend)


@register()
def check_tasks_backends(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Each ``TASKS`` entry of this backend has valid QUEUES and OPTIONS."""
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return []
    return [
        Error(
            f"TASKS[{alias!r}]: {message}",
            hint="Fix settings.TASKS; see pgqueue's docs/guide/django-tasks.md.",
            id=check_id,
        )
        for alias, params in tasks.items()
        if isinstance(params, dict) and _uses_this_backend(params.get("BACKEND"))
        for check_id, message in config_problems(params)
    ]
