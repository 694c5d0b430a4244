"""pgqueue's exceptions. Each class's docstring is the default message."""

from __future__ import annotations

import datetime as dt


class PgQueueError(Exception):
    """A pgqueue error."""

    #: A short machine-readable code, used by the HTTP API's JSON errors.
    code = "pgqueue_error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def detail(self) -> str:
        return str(self.args[0]) if self.args else ""


class PermanentError(PgQueueError):
    """The job failed in a way that retrying cannot fix; it goes straight to dead.

    Raise it from a handler for bad input and similar failures: no further attempt is made.
    """

    code = "permanent_error"


class Retry(PgQueueError):
    """The handler asked to run again later: not a failure, and no attempt is spent.

    ``raise pgqueue.Retry(in_=30)`` (seconds or a timedelta, above 0 and at most
    ``PGQUEUE["MAX_RETRY_DELAY_SECONDS"]``) puts the job back, scheduled that much later,
    with its attempt given back: a snooze, for "not yet" rather than "went wrong" (a rate
    limit of the service it calls, a resource not ready). A job may snooze at most
    ``PGQUEUE["MAX_SNOOZES"]`` times; past that a snooze counts as a failed attempt (and
    backs off, or ends the job dead, like any failure), so none snoozes for ever.
    """

    code = "retry"

    def __init__(self, in_: float | dt.timedelta, reason: str | None = None) -> None:
        seconds = in_.total_seconds() if isinstance(in_, dt.timedelta) else in_
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError("Retry(in_=...) takes seconds (a number) or a timedelta")
        self.seconds = float(seconds)
        self.reason = reason
        why = f": {reason}" if reason else ""
        super().__init__(f"snoozed for {self.seconds:g} s{why}")


class JobCancelled(PgQueueError):
    """The job was asked to stop: its cancellation was requested while it ran.

    ``job.heartbeat()`` raises it (``job.cancelled`` turns true at the same moment) so that
    a handler stops early; the worker has recorded, or is recording, the attempt as
    cancelled, and whatever the handler returns or raises afterwards is discarded.
    """

    code = "job_cancelled"


class JobTimedOut(JobCancelled):
    """The attempt ran past its timeout: recorded failed ("timed out after N s"), retried
    or dead as any failure; the handler should stop, its outcome is discarded."""

    code = "job_timed_out"


class InvalidJob(PgQueueError):
    """The job was refused: one of its fields is invalid."""

    code = "invalid"

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")

    @property
    def fields(self) -> dict[str, str]:
        return {self.field: self.reason}


class UnknownTask(InvalidJob):
    """No task is registered under that name."""

    code = "unknown_task"

    def __init__(self, name: str) -> None:
        self.task_name = name
        super().__init__("task", f"no task named {name!r} is registered")


class PayloadTooLarge(InvalidJob):
    """The payload is larger than PGQUEUE["MAX_PAYLOAD_BYTES"]."""

    code = "payload_too_large"

    def __init__(self, size: int, limit: int, field: str = "payload") -> None:
        super().__init__(field, f"{size} bytes of JSON, more than the limit of {limit}")


class TooManyQueues(InvalidJob):
    """The tenant has jobs in PGQUEUE["MAX_QUEUES_PER_TENANT"] queues already."""

    code = "too_many_queues"

    def __init__(self, tenant: str, queue: str, limit: int) -> None:
        self.tenant = tenant
        self.queue = queue
        self.limit = limit
        super().__init__(
            "queue",
            f"tenant {tenant!r} already has jobs in {limit} queues, the most "
            f"PGQUEUE['MAX_QUEUES_PER_TENANT'] allows; {queue!r} is not one of them "
            "(a queue stops counting once its jobs have finished and maintenance has "
            "released it)",
        )


class JobNotFound(PgQueueError):
    """No such job."""

    code = "not_found"


class InvalidTransition(PgQueueError):
    """The job is not in a state that allows this operation."""

    code = "conflict"

    def __init__(self, job_id: int, status: str, action: str, allowed: str) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(f"job {job_id} is {status}; only {allowed} jobs can be {action}")


class JobFailed(PgQueueError):
    """The job ended without a result: dead (out of attempts, or a permanent error) or
    cancelled. ``pgqueue.result`` and ``Job.wait`` raise it; ``status``, ``last_error`` and
    ``job_id`` say how it ended (``last_error`` is the job's last recorded error: for a
    cancelled job, that of an earlier failed attempt, or None when none failed)."""

    code = "job_failed"

    def __init__(self, job_id: int, status: str, last_error: str | None) -> None:
        self.job_id = job_id
        self.status = status
        self.last_error = last_error
        why = f": {last_error}" if last_error else ""
        super().__init__(f"job {job_id} ended {status}{why}")


class ResultTimeout(PgQueueError, TimeoutError):
    """The job had not ended when the wait's timeout ran out; it may still run and end.

    A ``TimeoutError`` too, so ``except TimeoutError`` catches it.
    """

    code = "result_timeout"

    def __init__(self, job_id: int, status: str, timeout: float) -> None:
        self.job_id = job_id
        self.status = status
        self.timeout = timeout
        super().__init__(f"job {job_id} is still {status} after {timeout:g} s")


class JobNotCommitted(PgQueueError):
    """The job is in a transaction that has not committed: no worker can see it, so a
    wait for it inside that transaction would never end. Wait after the transaction
    commits (outside ``transaction.atomic()``, or in ``transaction.on_commit``)."""

    code = "not_committed"

    def __init__(self, job_id: int, alias: str) -> None:
        self.job_id = job_id
        super().__init__(
            f"job {job_id} was enqueued in the open transaction of database {alias!r}: no "
            "worker can see it before that transaction commits, so waiting for it there "
            "would never end; wait after the transaction commits (outside "
            "transaction.atomic(), or in transaction.on_commit)"
        )


class UpstreamTooLarge(PermanentError):
    """The results of a job's dependencies are larger, together, than
    ``PGQUEUE["MAX_UPSTREAM_RESULT_BYTES"]``: ``job.upstream_results`` would not fit in a
    worker's memory. A ``PermanentError``: a handler that lets it propagate makes its job
    dead at once (retrying cannot shrink the results); one that catches it can read what it
    needs itself, e.g. ``pgqueue.result(id)`` of each dependency."""

    def __init__(
        self, job_id: int, count: int, total: int, limit: int, ids: list[int] | None = None
    ) -> None:
        self.job_id, self.count, self.total, self.limit = job_id, count, total, limit
        #: The dependencies' ids, in id order (each one's result: ``pgqueue.result(id)``).
        self.ids = ids or []
        super().__init__(
            f"the results of job {job_id}'s {count} dependencies take {total} bytes, more "
            f"than PGQUEUE['MAX_UPSTREAM_RESULT_BYTES'] ({limit})"
        )
