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
this module wherever ``TASKS`` names the backend, so the workers' settings must name it too.

``OPTIONS``:

- ``TENANT``: the tenant of every job (default ``PGQUEUE["DEFAULT_TENANT"]``); or
- ``TENANT_CALLABLE``: a callable, or its dotted path, ``(task, args, kwargs) -> tenant``,
  called at each enqueue with the JSON-normalised arguments;
- ``MAX_ATTEMPTS``: 1..100 (default ``PGQUEUE["DEFAULT_MAX_ATTEMPTS"]``). A failed attempt
  is retried after pgqueue's backoff, which is global: ``PGQUEUE["BACKOFF_BASE"]`` and
  ``["BACKOFF_CAP"]``, not a per-backend option.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import re
from collections.abc import Callable, Iterable
from traceback import format_exception
from typing import Any

import django
from django.conf import settings
from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from . import services
from .decorators import Task as PgQueueTask
from .decorators import task as pgqueue_task
from .exceptions import InvalidJob, PermanentError
from .models import Job, JobAttempt, Outcome, Status
from .registry import TASK_NAME_RE, register_family

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
            "Django 5.2 the django-tasks backport (pip install 'pgqueue[tasks]')."
        ) from exc

__all__ = [
    "FAMILY",
    "LeaseExpired",
    "PgQueueBackend",
    "check_tasks_backends",
]

#: The pgqueue task name of Django Tasks jobs: ``FAMILY`` or ``FAMILY + ":" + module path``.
FAMILY = "django.tasks"
#: The ``OPTIONS`` the backend understands.
OPTION_NAMES = ("TENANT", "TENANT_CALLABLE", "MAX_ATTEMPTS")
MAX_JOB_ID = 2**63 - 1

#: pgqueue job status -> the framework's status. A job waiting for a retry is READY ("ready
#: to be executed again"); a cancelled one FAILED ("unable to start").
STATUSES = {
    Status.SCHEDULED: TaskResultStatus.READY,
    Status.QUEUED: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.DONE: TaskResultStatus.SUCCESSFUL,
    Status.DEAD: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
}
#: Attempt outcomes that count as attempts of the current run of a job.
ATTEMPT_OUTCOMES = (Outcome.DONE, Outcome.FAILED, Outcome.LEASE_EXPIRED)
_CLASS_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class LeaseExpired(Exception):
    """An attempt that ended without an outcome: its worker stopped renewing the job's lease
    (it crashed, was killed or stalled) and the job was recovered. ``TaskResult.errors``
    names this class for such an attempt, whose "traceback" is pgqueue's account of it."""


# -- configuration ----------------------------------------------------------------------------


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


def _uses_this_backend(path: Any) -> bool:
    if path == f"{__name__}.PgQueueBackend":
        return True
    if not isinstance(path, str):
        return False
    try:
        cls = import_string(path)
    except ImportError:
        return False  # the framework reports a backend it cannot import
    return isinstance(cls, type) and issubclass(cls, PgQueueBackend)


@register()
def check_tasks_backends(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Each ``TASKS`` entry of this backend has valid QUEUES and OPTIONS."""
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return []
    return [
        Error(
            f"TASKS[{alias!r}]: {message}",
            hint="Fix settings.TASKS; see \"Django's Tasks framework\" in pgqueue's README.",
            id=check_id,
        )
        for alias, params in tasks.items()
        if isinstance(params, dict) and _uses_this_backend(params.get("BACKEND"))
        for check_id, message in config_problems(params)
    ]


# -- the backend ------------------------------------------------------------------------------


class PgQueueBackend(BaseTaskBackend):
    """Django's Tasks framework on pgqueue; see the module's docstring."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

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

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not isinstance(task.queue_name, str) or not services.NAME_RE.match(task.queue_name):
            raise InvalidTask(
                f"Queue {task.queue_name!r} is not a valid pgqueue queue name "
                "([A-Za-z0-9_.-]{1,64})."
            )

    def enqueue(self, task: Task, args: Iterable[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Write the job in the current transaction; send ``task_enqueued``."""
        self.validate_task(task)
        options = self.pgqueue_options
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        enqueued_at = timezone.now()
        payload: dict[str, Any] = {
            "task": task.module_path,
            "backend": self.alias,
            "args": args,
            "kwargs": kwargs,
            "enqueued_at": enqueued_at.isoformat(),
        }
        run_at = task.run_after
        if run_at is not None:
            payload["run_after"] = run_at.isoformat()
            if timezone.is_naive(run_at):  # only with USE_TZ = False
                run_at = timezone.make_aware(run_at)
        tenant = options.tenant
        if options.tenant_callable is not None:
            tenant = options.tenant_callable(task, args, kwargs)
        job, _ = services.enqueue(
            _job_task(task.module_path),
            payload,
            tenant=tenant,
            queue=task.queue_name,
            priority=task.priority,
            run_at=run_at,
            max_attempts=options.max_attempts,
        )
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The job's state as a TaskResult; errors and worker ids from its attempt history.

        Raises TaskResultDoesNotExist unless ``result_id`` names a job of this backend.
        """
        job_id = _job_id(result_id)
        row = (
            Job.objects.filter(pk=job_id)
            .values(
                "task",
                "payload",
                "status",
                "queue",
                "priority",
                "attempts",
                "lease_owner",
                "created_at",
                "started_at",
                "finished_at",
                "result",
            )
            .first()
            if job_id is not None
            else None
        )
        payload = row["payload"] if row is not None else None
        if (
            row is None
            or (row["task"] != FAMILY and not row["task"].startswith(f"{FAMILY}:"))
            or not isinstance(payload, dict)
            or payload.get("backend") != self.alias
        ):
            raise TaskResultDoesNotExist(result_id)
        running = row["status"] == Status.RUNNING
        history = _history(job_id, row["attempts"] - 1 if running else row["attempts"])
        worker_ids, errors = _workers_and_errors(history)
        if running and row["lease_owner"]:
            worker_ids.append(row["lease_owner"])
        last_attempted_at = row["started_at"] if row["attempts"] else None
        first_started_at = history[0]["started_at"] if history else None
        result = TaskResult(
            task=_rebuild(
                import_string(payload["task"]),
                backend=self.alias,
                queue_name=row["queue"],
                priority=row["priority"],
                run_after=_datetime(payload.get("run_after")),
            ),
            id=str(job_id),
            status=STATUSES[row["status"]],
            enqueued_at=_datetime(payload.get("enqueued_at")) or row["created_at"],
            started_at=first_started_at or last_attempted_at,
            finished_at=row["finished_at"] if row["status"] in _FINISHED else None,
            last_attempted_at=last_attempted_at,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=worker_ids,
        )
        if row["status"] == Status.DONE:
            object.__setattr__(result, "_return_value", row["result"])
        return result


_FINISHED = (Status.DONE, Status.DEAD, Status.CANCELLED)


def _job_task(module_path: str) -> PgQueueTask:
    """The pgqueue task a job is enqueued as: the runner, named after the function."""
    name = f"{FAMILY}:{module_path}"
    return dataclasses.replace(RUNNER, name=name if TASK_NAME_RE.match(name) else FAMILY)


def _job_id(result_id: Any) -> int | None:
    text = str(result_id)
    if not text.isascii() or not text.isdigit():
        return None
    job_id = int(text)
    return job_id if 1 <= job_id <= MAX_JOB_ID else None


def _datetime(value: Any) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else None


def _history(job_id: int, count: int) -> list[dict[str, Any]]:
    """The last ``count`` attempts of a job (its current run: a retry from the admin restarts
    the count, the older rows stay), oldest first."""
    if count <= 0:
        return []
    rows = (
        JobAttempt.objects.filter(job_id=job_id, outcome__in=ATTEMPT_OUTCOMES)
        .order_by("-id")
        .values("worker", "outcome", "error", "traceback", "started_at")[:count]
    )
    return list(reversed(rows))


def _workers_and_errors(history: list[dict[str, Any]]) -> tuple[list[str], list[TaskError]]:
    worker_ids = [row["worker"] for row in history]
    errors = [_task_error(row) for row in history if row["outcome"] != Outcome.DONE]
    return worker_ids, errors


def _task_error(row: dict[str, Any]) -> TaskError:
    """A failed attempt as the framework's TaskError.

    pgqueue records ``"<module>.<class>: <message>"`` (builtins without their module) and
    the traceback; a lease that expired is a :class:`LeaseExpired`.
    """
    text = row["error"] or ""
    if row["outcome"] == Outcome.LEASE_EXPIRED:
        return TaskError(
            exception_class_path=f"{__name__}.LeaseExpired", traceback=text or "lease expired"
        )
    name = text.split(": ", 1)[0].strip()
    if not _CLASS_PATH_RE.match(name):
        path = "builtins.Exception"
    elif "." not in name:
        path = f"builtins.{name}"
    else:
        path = name
    return TaskError(exception_class_path=path, traceback=row["traceback"] or text)


def _rebuild(task: Any, **changes: Any) -> Task:
    """``task`` as it was enqueued (queue, priority, backend, run_after), not validated
    again: a result stays readable after the settings change."""
    if not isinstance(task, Task):
        raise TypeError(f"{task!r} is not a Task of Django's Tasks framework")
    clone = copy.copy(task)
    for name, value in changes.items():
        object.__setattr__(clone, name, value)
    return clone


# -- running ----------------------------------------------------------------------------------


def _run(payload: Any, job: Any) -> Any:
    """The pgqueue handler of every Django Tasks job (``job`` is the worker's JobContext).

    Imports the task, checks that it is a Task of a PgQueueBackend, sends ``task_started``,
    calls it (with a TaskContext if it takes one; a coroutine function runs to completion on
    this thread, through asgiref's ``async_to_sync`` as ``Task.call`` does, so its
    ``sync_to_async`` ORM calls come back to this thread and its connection), sends
    ``task_finished`` and returns the JSON return value, which becomes the job's result.
    An exception is re-raised for pgqueue to record (and retry); ``task_finished`` is sent
    from inside the handler of it, as Django's receivers expect.
    """
    if not (
        isinstance(payload, dict)
        and isinstance(payload.get("task"), str)
        and isinstance(payload.get("backend"), str)
        and isinstance(payload.get("args", []), list)
        and isinstance(payload.get("kwargs", {}), dict)
    ):
        raise PermanentError(
            'a Django Tasks job needs a payload {"task": <path>, "backend": <alias>, '
            '"args": [...], "kwargs": {...}}'
        )
    path, alias = payload["task"], payload["backend"]
    if job.task not in (FAMILY, f"{FAMILY}:{path}"):
        raise PermanentError(f"job task {job.task!r} does not match its payload's {path!r}")
    target = import_string(path)  # an ImportError is retried: a deploy may bring it
    if not isinstance(target, Task):
        raise PermanentError(f"{path} is not a Task of Django's Tasks framework")
    backend = task_backends[alias]
    if not isinstance(backend, PgQueueBackend):
        raise PermanentError(f"TASKS[{alias!r}] is not a {PgQueueBackend.__name__}")
    # Validated against this worker's settings (its QUEUES, say) as the framework does.
    task = dataclasses.replace(
        target,
        backend=alias,
        queue_name=job.queue,
        priority=job.priority,
        run_after=_datetime(payload.get("run_after")),
    )
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})

    now = timezone.now()
    history = _history(job.id, job.attempt - 1)
    worker_ids, errors = _workers_and_errors(history)
    worker_ids.append(job.worker_id)  # len(worker_ids) == job.attempt: TaskContext.attempt
    result = TaskResult(
        task=task,
        id=str(job.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=_datetime(payload.get("enqueued_at")),
        started_at=(history[0]["started_at"] if history else None) or now,
        finished_at=None,
        last_attempted_at=now,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=errors,
        worker_ids=worker_ids,
    )
    sender = type(backend)
    task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            raw = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            raw = task.call(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _finish_failed(sender, result, exc)
        raise
    try:
        value = normalize_json(raw)
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        # The same code would return the same thing again: retrying cannot help.
        try:
            raise PermanentError(f"the return value is not JSON: {exc}") from exc
        except PermanentError as permanent:
            _finish_failed(sender, result, permanent)
            raise
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender, task_result=result)
    return value


def _finish_failed(sender: type, result: TaskResult, exc: BaseException) -> None:
    """Record the failure on ``result`` and send ``task_finished`` (inside ``except``)."""
    object.__setattr__(result, "finished_at", timezone.now())
    result.errors.append(
        TaskError(
            exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
            traceback="".join(format_exception(exc)),
        )
    )
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    task_finished.send(sender, task_result=result)


#: The handler, registered as "django.tasks" and for every "django.tasks:<path>".
RUNNER = pgqueue_task(name=FAMILY)(_run)
register_family(FAMILY, RUNNER)
