"""Timeouts: how long one attempt of a job may run, and who enforces it.

A job's timeout is resolved when it is enqueued (the enqueue's ``timeout``, else the task's
``@pgqueue.task(timeout=...)``, else ``PGQUEUE["DEFAULT_TIMEOUT_SECONDS"]``) and stored
with it (``timeout_seconds``), so that every worker, of whatever release, and maintenance
read the same figure. It counts from the claim (the attempt's ``started_at``).

The worker holding the job enforces it: past the deadline it records the attempt failed
("timed out after N s"; retried with backoff or dead, as any failure) and tells the
handler (``job.cancelled``, ``job.heartbeat()`` raises ``JobTimedOut``); the handler's
eventual return is discarded. A thread cannot be killed: its slot is busy until the
handler returns. Maintenance is the backstop (JOB_REAP_TIMED_OUT) for a job still held a
lease's length past its deadline.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from .conf import pgqueue_settings
from .exceptions import InvalidJob


def max_timeout() -> float:
    return float(pgqueue_settings.MAX_TIMEOUT_SECONDS)


def validate_timeout(value: Any, field_name: str = "timeout") -> float | None:
    """Seconds (a number or a timedelta) greater than 0 and at most MAX_TIMEOUT_SECONDS;
    None is no timeout of its own."""
    if value is None:
        return None
    limit = max_timeout()
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(field_name, f"must be a number of seconds, from 0 (excluded) to {limit:g}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidJob(field_name, f"must be a finite number of seconds above 0, got {value!r}")
    if seconds > limit:
        raise InvalidJob(
            field_name,
            f"must be at most {limit:g} seconds (PGQUEUE['MAX_TIMEOUT_SECONDS']), got {seconds:g}",
        )
    return seconds


def resolve_timeout(override: Any, task_timeout: float | None) -> float | None:
    """The timeout a new job gets: the enqueue's, the task's, then the setting's."""
    for value in (override, task_timeout, pgqueue_settings.DEFAULT_TIMEOUT_SECONDS):
        if value is not None:
            return validate_timeout(value)
    return None


def timed_out_text(seconds: float) -> str:
    """The attempt's error; JOB_REAP_TIMED_OUT writes the same words."""
    return f"timed out after {seconds:g} s"


def for_task(name: str) -> float | None:
    """The timeout of a job of task ``name`` enqueued without one of its own (a periodic
    tick): the task's, else the setting's; a task this process does not know, the setting's."""
    from .exceptions import UnknownTask
    from .registry import get_task

    try:
        task_timeout = get_task(name).timeout
    except UnknownTask:
        task_timeout = None
    return resolve_timeout(None, task_timeout)
