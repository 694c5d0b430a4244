"""Running Django Tasks jobs: the one pgqueue handler of the whole ``django.tasks`` family of
task names, registered at import, and the framework's ``task_started`` / ``task_finished``
signals it sends around each run.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from traceback import format_exception
from typing import Any

from django.utils import timezone

from ..decorators import Task as PgQueueTask
from ..decorators import task as pgqueue_task
from ..exceptions import PermanentError
from ..registry import TASK_NAME_RE, register_family
from .framework import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .options import ConfiguredBackend
from .results import FAMILY, history, parse_datetime, task_result


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
    target = _resolve(path)
    backend = task_backends[alias]
    if not isinstance(backend, ConfiguredBackend):
        raise PermanentError(f"TASKS[{alias!r}] is not a PgQueueBackend")
    # Validated against this worker's settings (its QUEUES, say) as the framework does.
    task = dataclasses.replace(
        target,
        backend=alias,
        queue_name=job.queue,
        priority=job.priority,
        run_after=parse_datetime(payload.get("run_after")),
    )
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})

    now = timezone.now()
    result = task_result(
        task,
        job_id=job.id,
        backend=alias,
        status=TaskResultStatus.RUNNING,
        args=args,
        kwargs=kwargs,
        enqueued_at=parse_datetime(payload.get("enqueued_at")),
        history=history(job.id, job.attempt - 1),
        # len(worker_ids) == job.attempt: TaskContext.attempt
        current_worker=job.worker_id,
        last_attempted_at=now,
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


def _resolve(path: str) -> Task:
    """The Django Task at ``path``, looked up among the modules already imported, never
    imported for the job: a job's task name can come from a caller (an HTTP request), and
    importing a module runs its code. The worker's start-up autodiscovery imports every
    app's TASK_MODULES, so a project's tasks are there; anything else fails permanently.
    """
    module_path, _, attr = path.rpartition(".")
    module = sys.modules.get(module_path) if module_path else None
    if module is None:
        raise PermanentError(
            f"{path}: module {module_path!r} is not imported by this worker; a Django Task "
            "must live in a module the worker imports at start-up (an app's TASK_MODULES)"
        )
    target = getattr(module, attr, None)
    if not isinstance(target, Task):
        raise PermanentError(f"{path} is not a Task of Django's Tasks framework")
    return target


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


def job_task(module_path: str) -> PgQueueTask:
    """The pgqueue task a job is enqueued as: the runner, named after the function."""
    name = f"{FAMILY}:{module_path}"
    return dataclasses.replace(RUNNER, name=name if TASK_NAME_RE.match(name) else FAMILY)
