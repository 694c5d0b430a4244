"""``PgQueueBackend``: the framework's enqueue and get_result on pgqueue's service layer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from .. import services
from .framework import (
    InvalidTask,
    Task,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .options import ConfiguredBackend
from .results import read_result, task_result
from .runner import job_task


class PgQueueBackend(ConfiguredBackend):
    """Django's Tasks framework on pgqueue; see the ``pgqueue.backends`` docstring."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

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
            job_task(task.module_path),
            payload,
            tenant=tenant,
            queue=task.queue_name,
            priority=task.priority,
            run_at=run_at,
            max_attempts=options.max_attempts,
        )
        result = task_result(
            task,
            job_id=job.id,
            backend=self.alias,
            status=TaskResultStatus.READY,
            args=args,
            kwargs=kwargs,
            enqueued_at=enqueued_at,
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The job's state as a TaskResult; errors and worker ids from its attempt history.

        Raises TaskResultDoesNotExist unless ``result_id`` names a job of this backend.
        """
        return read_result(self.alias, result_id)
