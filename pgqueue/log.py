"""Which job a log record was emitted in: a context variable and a logging filter.

The worker sets the running job around each handler call (``job_context``), on the thread
(or in the asyncio task) that runs it. ``JobContextFilter``, put on a logging handler, copies
that job onto every record passing through the handler, whichever logger emitted it:

- ``pgqueue_job_id``, ``pgqueue_task``, ``pgqueue_tenant``, ``pgqueue_queue``,
  ``pgqueue_attempt``: the job's fields, or ``""`` outside a job;
- ``pgqueue_job``: ``"job=<id> task=<name> tenant=<name> attempt=<n> "`` or ``""``, ready
  to put in front of ``%(message)s``.

A thread the handler starts itself does not inherit the job (context variables do not
cross ``threading.Thread``); ``contextvars.copy_context().run`` carries it over.

``print`` output has no record to carry the job: runworker wraps stdout and stderr
(``pgqueue.stdio``), which read the same variable and put ``job=<id> `` in front of each
line a running job writes.
(Not named ``logging`` so that it never shadows the standard module.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .worker.context import JobContext

_running: ContextVar[JobContext | None] = ContextVar("pgqueue_running_job", default=None)
#: Called with each job as its block ends: ``pgqueue.stdio`` writes out the job's last line
#: if it had no newline, which would otherwise wait for the next job to finish it.
_on_job_end: list[Callable[[JobContext], None]] = []

#: The format runworker logs with when the project configured no logging handler.
DEFAULT_FORMAT = "time=%(asctime)s level=%(levelname)s logger=%(name)s %(pgqueue_job)s%(message)s"


def current_job() -> JobContext | None:
    """The job this thread or asyncio task is running, if any."""
    return _running.get()


@contextlib.contextmanager
def job_context(job: JobContext) -> Iterator[None]:
    """Mark ``job`` as the one running here for the duration of the block."""
    token = _running.set(job)
    try:
        yield
    finally:
        for callback in _on_job_end:
            callback(job)
        _running.reset(token)


def on_job_end(callback: Callable[[JobContext], None]) -> None:
    """Call ``callback(job)`` whenever a ``job_context`` block ends."""
    _on_job_end.append(callback)


class JobContextFilter(logging.Filter):
    """Adds the running job's fields to each record (never drops one).

    Use it in ``LOGGING``::

        "filters": {"pgqueue_job": {"()": "pgqueue.log.JobContextFilter"}},
        "handlers": {"console": {"class": "logging.StreamHandler",
                                 "filters": ["pgqueue_job"], "formatter": "job"}},
        "formatters": {"job": {"format": "%(levelname)s %(pgqueue_job)s%(message)s"}},
    """

    def filter(self, record: logging.LogRecord) -> bool:
        job = _running.get()
        if job is None:
            record.pgqueue_job_id = record.pgqueue_task = record.pgqueue_tenant = ""
            record.pgqueue_queue = record.pgqueue_attempt = record.pgqueue_job = ""
        else:
            record.pgqueue_job_id = job.id
            record.pgqueue_task = job.task
            record.pgqueue_tenant = job.tenant
            record.pgqueue_queue = job.queue
            record.pgqueue_attempt = job.attempt
            record.pgqueue_job = (
                f"job={job.id} task={job.task} tenant={job.tenant} attempt={job.attempt} "
            )
        return True
