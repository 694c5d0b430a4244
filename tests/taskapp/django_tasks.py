"""Tasks of Django's Tasks framework, for tests/test_tasks_backend.py.

Defined for the backend named "default": in the test process that is the framework's
default backend when this module is imported (so every task here must be valid for it: the
queue "default", any priority), and PgQueueBackend in the workers and under the tests'
settings. Workers talk to the test through files, as in tests/taskapp/tasks.py.

Each worker also records the framework's task_started and task_finished signals as JSON
lines in the file ``$TEST_TASKS_SIGNAL_LOG``, when that is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import django

from pgqueue.models import Job

if django.VERSION >= (6, 0):
    from django.tasks import task
    from django.tasks.signals import task_finished, task_started
else:
    from django_tasks import task
    from django_tasks.signals import task_finished, task_started


@task
def noop() -> None:
    return None


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task(priority=10)
def important() -> str:
    return "important"


@task
async def async_add(a: int, b: int) -> dict[str, Any]:
    """A coroutine; the ORM through its async API, from the worker's handler thread."""
    await asyncio.sleep(0)
    orm = await Job.objects.filter(task__startswith="django.tasks:").aexists()
    return {"sum": a + b, "orm": orm}


@task(takes_context=True)
def with_context(context: Any, tag: str) -> dict[str, Any]:
    result = context.task_result
    return {
        "tag": tag,
        "attempt": context.attempt,
        "id": result.id,
        "status": str(result.status),
        "worker_ids": result.worker_ids,
        "task": result.task.module_path,
        "queue": result.task.queue_name,
    }


@task(takes_context=True)
def flaky(context: Any, succeed_on: int) -> dict[str, int]:
    """Fail every attempt before ``succeed_on``, then succeed."""
    if context.attempt < succeed_on:
        raise ValueError(f"failing on purpose on attempt {context.attempt}")
    return {"attempt": context.attempt, "errors": len(context.task_result.errors)}


@task
def always_fails() -> None:
    raise ValueError("always fails")


@task
def bad_return() -> Any:
    return {1, 2, 3}  # a set is not JSON


@task(takes_context=True)
def block(context: Any, started: str, release: str, timeout: float = 30) -> dict[str, Any]:
    """Touch ``<started>.<attempt>``, then run until the file ``release`` exists."""
    Path(f"{started}.{context.attempt}").touch()
    deadline = time.monotonic() + timeout
    while not Path(release).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} did not appear")
        time.sleep(0.02)
    return {"attempt": context.attempt, "worker": context.task_result.worker_ids[-1]}


def without_context_argument(value: int) -> int:
    """Not a task: tests decorate it with takes_context=True, which must be refused."""
    return value


def tenant_from_kwargs(task: Any, args: list[Any], kwargs: dict[str, Any]) -> str:
    """OPTIONS TENANT_CALLABLE of the tests: the tenant named by the kwarg "customer"."""
    return kwargs.get("customer", "nobody")


# -- the signals, recorded in the workers -------------------------------------------------------


def _record(signal_name: str, task_result: Any) -> None:
    path = os.environ.get("TEST_TASKS_SIGNAL_LOG")
    if not path:
        return
    line = {
        "signal": signal_name,
        "id": task_result.id,
        "status": str(task_result.status),
        "attempt": task_result.attempts,
        "errors": [e.exception_class_path for e in task_result.errors],
        "in_except": sys.exc_info()[0] is not None,
    }
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")


def on_task_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _record("task_started", task_result)


def on_task_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _record("task_finished", task_result)


task_started.connect(on_task_started, dispatch_uid="tests.taskapp.django_tasks.started")
task_finished.connect(on_task_finished, dispatch_uid="tests.taskapp.django_tasks.finished")
