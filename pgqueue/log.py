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

``JsonFormatter`` writes each record as one JSON object on one line, with the job's
fields and the current OpenTelemetry span's ids: runworker's format with
``PGQUEUE["LOG_FORMAT"] = "json"`` (or ``--log-format json``), and usable in a project's
``LOGGING``.

(Not named ``logging`` so that it never shadows the standard module.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from . import tracing

if TYPE_CHECKING:
    from .worker.context import JobContext

_running: ContextVar[JobContext | None] = ContextVar("pgqueue_running_job", default=None)
#: Called with each job as its block ends: ``pgqueue.stdio`` writes out the job's last line
#: if it had no newline, which would otherwise wait for the next job to finish it.
_on_job_end: list[Callable[[JobContext], None]] = []

#: The format runworker logs with when the project configured no logging handler.
DEFAULT_FORMAT = "time=%(asctime)s level=%(levelname)s logger=%(name)s %(pgqueue_job)s%(message)s"
#: Its ``datefmt``.
DEFAULT_DATEFMT = "%Y-%m-%dT%H:%M:%S%z"
#: The values of PGQUEUE["LOG_FORMAT"] and of runworker's --log-format.
LOG_FORMATS = ("logfmt", "json")


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


#: The attributes every LogRecord has: what is not one of them came as ``extra``.
_RECORD_FIELDS = frozenset(
    {*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime", "taskName"}
)
#: The job's fields in a JSON line, and the record attributes JobContextFilter gives them.
_JOB_FIELDS = (
    ("job_id", "pgqueue_job_id"),
    ("task", "pgqueue_task"),
    ("tenant", "pgqueue_tenant"),
    ("queue", "pgqueue_queue"),
    ("attempt", "pgqueue_attempt"),
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC, to the
    millisecond), ``level``, ``logger``, ``message``; in a job, ``job_id``, ``task``,
    ``tenant``, ``queue`` and ``attempt``; inside an OpenTelemetry span, ``trace_id`` and
    ``span_id`` (hex, as trace back ends show them); ``exc_info`` and ``stack_info`` as
    text when the record has them; then the record's ``extra`` fields, each as JSON if it
    is, else as its ``str()``, so that no value a caller logs can make the line fail.
    Written in ASCII (``\\u`` escapes): a lone surrogate in a message (a handler's error
    text) cannot fail the stream's encoding either.

    The job and the span are those of the thread (or asyncio task) the record is
    formatted on, the one that logged it with the usual handlers; behind a
    ``QueueHandler``, put ``JobContextFilter`` on it to carry the job's fields over.

    Use it in ``LOGGING``::

        "formatters": {"json": {"()": "pgqueue.log.JsonFormatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_job_fields(record))
        ids = tracing.current_ids()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        extra = {
            key: value
            for key, value in record.__dict__.items()
            if key not in _RECORD_FIELDS and not key.startswith("pgqueue_") and key not in entry
        }
        entry.update(extra)
        try:
            return json.dumps(entry, default=str)
        except Exception:  # an extra json cannot take as it is (or whose str() raises)
            entry.update({key: _storable(value) for key, value in extra.items()})
            return json.dumps(entry, default=str)


def _job_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The job's fields: as JobContextFilter put them on the record, else the job running
    here; none outside a job."""
    if getattr(record, "pgqueue_job_id", ""):
        return {name: getattr(record, attr, "") for name, attr in _JOB_FIELDS}
    job = _running.get()
    if job is None:
        return {}
    return {
        "job_id": job.id,
        "task": job.task,
        "tenant": job.tenant,
        "queue": job.queue,
        "attempt": job.attempt,
    }


def _storable(value: Any) -> Any:
    """``value`` if json can write it (with ``default=str``), else its ``str()``, else its
    type's name."""
    try:
        json.dumps(value, default=str)
        return value
    except Exception:
        pass
    try:
        return str(value)
    except Exception:  # a value whose str() raises is still not the line's end
        return f"<{type(value).__qualname__}>"


def formatter(log_format: str) -> logging.Formatter:
    """runworker's formatter for ``log_format`` ("logfmt" or "json")."""
    if log_format == "json":
        return JsonFormatter()
    return logging.Formatter(DEFAULT_FORMAT, datefmt=DEFAULT_DATEFMT)
