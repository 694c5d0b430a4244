"""How a pgqueue job reads as the framework's ``TaskResult``: status, times, errors and
worker ids from the job row and its attempt history.

:func:`task_result` is the one place a ``TaskResult`` is built: at enqueue, when a worker
starts a run and when ``get_result`` reads a job back.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from django.utils.module_loading import import_string

from ..conf import queue_db
from ..models import Job, JobAttempt, Outcome, Status
from .framework import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus

#: The pgqueue task name of Django Tasks jobs: ``FAMILY`` or ``FAMILY + ":" + module path``.
FAMILY = "django.tasks"
MAX_JOB_ID = 2**63 - 1
#: The documented path of :class:`LeaseExpired` (the package re-exports it).
LEASE_EXPIRED_PATH = "pgqueue.backends.LeaseExpired"

#: pgqueue job status -> the framework's status. A job waiting for a retry is READY ("ready
#: to be executed again"), as one waiting for its dependencies (pgqueue.workflows); a
#: cancelled one FAILED ("unable to start").
STATUSES = {
    Status.WAITING: TaskResultStatus.READY,
    Status.SCHEDULED: TaskResultStatus.READY,
    Status.QUEUED: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.DONE: TaskResultStatus.SUCCESSFUL,
    Status.DEAD: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
}
#: Attempt outcomes that count as attempts of the current run of a job.
ATTEMPT_OUTCOMES = (Outcome.DONE, Outcome.FAILED, Outcome.LEASE_EXPIRED)
_FINISHED = (Status.DONE, Status.DEAD, Status.CANCELLED)
_CLASS_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class LeaseExpired(Exception):
    """An attempt that ended without an outcome: its worker stopped renewing the job's lease
    (it crashed, was killed or stalled) and the job was recovered. ``TaskResult.errors``
    names this class for such an attempt, whose "traceback" is pgqueue's account of it."""


def task_result(
    task: Task,
    *,
    job_id: int,
    backend: str,
    status: TaskResultStatus,
    args: list[Any],
    kwargs: dict[str, Any],
    enqueued_at: dt.datetime | None,
    history: Sequence[dict[str, Any]] = (),
    current_worker: str | None = None,
    last_attempted_at: dt.datetime | None = None,
    finished_at: dt.datetime | None = None,
) -> TaskResult:
    """A job as the framework's result.

    ``history`` is its finished attempts of the current run (see :func:`history`), oldest
    first, and ``current_worker`` the worker of the attempt in progress, if any: together
    they give ``worker_ids`` (one per attempt, as ``TaskContext.attempt`` counts them) and
    ``errors``. The run started when its first attempt's handler began (or, for an attempt
    no worker saw begin, when it was claimed).
    """
    worker_ids = [row["worker"] for row in history]
    if current_worker is not None:
        worker_ids.append(current_worker)
    return TaskResult(
        task=task,
        id=str(job_id),
        status=status,
        enqueued_at=enqueued_at,
        started_at=(_began(history[0]) if history else None) or last_attempted_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[_task_error(row) for row in history if row["outcome"] != Outcome.DONE],
        worker_ids=worker_ids,
    )


def read_result(alias: str, result_id: str) -> TaskResult:
    """The job ``result_id`` of the backend ``alias`` as a TaskResult.

    Raises TaskResultDoesNotExist unless ``result_id`` names a job of that backend.
    """
    job_id = _job_id(result_id)
    row = (
        Job.objects.using(queue_db())
        .filter(pk=job_id)
        .values(
            "task",
            "payload",
            "status",
            "queue",
            "priority",
            "attempts",
            "lease_owner",
            "created_at",
            "claimed_at",
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
        or payload.get("backend") != alias
        # The path imported below is the one the job was enqueued as, never one a payload
        # names on its own: the runner refuses the same mismatch.
        or not isinstance(payload.get("task"), str)
        or row["task"] not in (FAMILY, f"{FAMILY}:{payload['task']}")
    ):
        raise TaskResultDoesNotExist(result_id)
    running = row["status"] == Status.RUNNING
    result = task_result(
        _rebuild(
            import_string(payload["task"]),
            backend=alias,
            queue_name=row["queue"],
            priority=row["priority"],
            run_after=parse_datetime(payload.get("run_after")),
        ),
        job_id=job_id,
        backend=alias,
        status=STATUSES[row["status"]],
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        enqueued_at=parse_datetime(payload.get("enqueued_at")) or row["created_at"],
        history=history(job_id, row["attempts"] - 1 if running else row["attempts"]),
        current_worker=row["lease_owner"] if running and row["lease_owner"] else None,
        # A running job's handler start is written within a second of it (a heartbeat
        # round); until then, and while it waits for a thread, its claim is the attempt's.
        last_attempted_at=_began(row) if row["attempts"] else None,
        finished_at=row["finished_at"] if row["status"] in _FINISHED else None,
    )
    if row["status"] == Status.DONE:
        object.__setattr__(result, "_return_value", row["result"])
    return result


def history(job_id: int, count: int) -> list[dict[str, Any]]:
    """The last ``count`` attempts of a job (its current run: a retry from the admin restarts
    the count, the older rows stay), oldest first. A lease lost before the start was
    recorded (lease_expired, no started_at) was given back without spending an attempt
    (JOB_REAP_EXPIRED): not one of them."""
    if count <= 0:
        return []
    rows = (
        JobAttempt.objects.using(queue_db())
        .filter(job_id=job_id, outcome__in=ATTEMPT_OUTCOMES)
        .exclude(outcome=Outcome.LEASE_EXPIRED, started_at__isnull=True)
        .order_by("-id")
        .values("worker", "outcome", "error", "traceback", "claimed_at", "started_at")[:count]
    )
    return list(reversed(rows))


def _began(row: dict[str, Any]) -> dt.datetime | None:
    """When an attempt (a job's or an attempt row's) was made: its handler's start, else
    its claim (an attempt no worker saw begin)."""
    return row["started_at"] or row["claimed_at"]


def parse_datetime(value: Any) -> dt.datetime | None:
    """A time the payload carries as ISO text; None if it has none."""
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else None


def _job_id(result_id: Any) -> int | None:
    text = str(result_id)
    if not text.isascii() or not text.isdigit():
        return None
    job_id = int(text)
    return job_id if 1 <= job_id <= MAX_JOB_ID else None


def _task_error(row: dict[str, Any]) -> TaskError:
    """A failed attempt as the framework's TaskError.

    pgqueue records ``"<module>.<class>: <message>"`` (builtins without their module) and
    the traceback; a lease that expired is a :class:`LeaseExpired`.
    """
    text = row["error"] or ""
    if row["outcome"] == Outcome.LEASE_EXPIRED:
        return TaskError(exception_class_path=LEASE_EXPIRED_PATH, traceback=text or "lease expired")
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
