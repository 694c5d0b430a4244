"""Waiting for a job's result: ``pgqueue.result(job_id, timeout)`` and ``Job.wait``.

A wait is woken by the database, not by polling. Every statement that ends a job (done,
dead, cancelled; not a failure that will be retried) sends, in its own transaction,
``pg_notify('pgqueue_finished', '<id>,<id>,...')`` with the ids of the jobs it ended
(the ``notified`` CTEs of ``queries/jobs.sql``); PostgreSQL delivers it on commit. A
``Waiter``:

1. opens a psycopg connection of its own, built from the alias's ``DATABASES`` entry as
   the worker's are: Django's connection, and whatever transaction the caller has open on
   it, is left alone;
2. LISTENs on ``pgqueue_finished``, and only then
3. reads the job (JOB_GET_OUTCOME). An end committed before the LISTEN is in that read,
   one committed after it is notified: none can fall between the two;
4. sleeps on the connection until a notification names the job, and reads it again.

One notification carries the ids of a whole batch (a worker's turn records many jobs in
one statement), so one commit wakes every waiter of its jobs, and each picks its own id
out of the payload. A waiter also reads its job again every
``PGQUEUE["RESULT_RECHECK_SECONDS"]`` (5 s by default), for an end that sent no
notification it could receive: one recorded while its connection was being re-made, or by
a worker of an older release during a rolling upgrade. That re-read is the safety net, not
the mechanism: a wait returns as soon as the notification arrives.

Delivery is at-least-once: the result a wait returns may be that of a second attempt (the
first one's worker died before recording it), never of two. A job ``dead`` or
``cancelled`` raises ``JobFailed``; a retried failure does not end the job, and the wait
goes on through its retries.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import random
import time
from typing import Any

import psycopg
from django.db import connections
from psycopg import sql as pgsql

from . import sql
from .conf import pgqueue_settings, queue_db
from .exceptions import JobFailed, JobNotCommitted, JobNotFound, ResultTimeout

logger = logging.getLogger("pgqueue")

#: The channel the statements that end jobs notify (queries/jobs.sql, ``notified``).
FINISHED_CHANNEL = "pgqueue_finished"
#: The largest job id (bigint).
MAX_JOB_ID = 2**63 - 1


def result(
    job_id: int, timeout: float | dt.timedelta | None = None, *, using: str | None = None
) -> Any:
    """Wait for job ``job_id`` to end and return its result (what its handler returned,
    decoded from JSON; None for a handler that returned nothing).

    :param timeout: seconds (or a timedelta) to wait at most; None waits as long as it
        takes, 0 looks once.
    :param using: the database alias of the queue (default ``PGQUEUE["DATABASE"]``).
    :raises JobFailed: the job ended ``dead`` or ``cancelled`` (``status``, ``last_error``
        and ``job_id`` say how).
    :raises ResultTimeout: (a ``TimeoutError``) the job had not ended after ``timeout``.
    :raises JobNotFound: no job has that id.
    :raises JobNotCommitted: the job was enqueued in the caller's transaction, which has
        not committed: no worker can see it, so the wait would never end.

    Each call holds one database connection of its own while it waits.
    """
    return Waiter(job_id, using=using).wait(timeout)


class Waiter:
    """One wait for one job, on a connection of its own (see the module's docstring)."""

    def __init__(self, job_id: int, *, using: str | None = None) -> None:
        self.job_id = _job_id(job_id)
        self.alias = queue_db(using)
        #: How many times the job was read: one at the start, one per notification that
        #: named it, one per safety re-read (and one per connection re-made).
        self.reads = 0
        #: How many notifications naming the job woke the wait.
        self.wakeups = 0

    def wait(self, timeout: float | dt.timedelta | None = None) -> Any:
        """The job's result once it is done; raises as ``result`` says."""
        from .worker.connection import CONNECTION_ERRORS, connect, connect_params

        limit = _timeout(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        params = connect_params(self.alias, application_name=f"pgqueue result {self.job_id}")
        delay = 0.1
        listened = False
        while True:
            try:
                with connect(params) as conn:
                    conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(FINISHED_CHANNEL)))
                    listened, delay = True, 0.1
                    return self._watch(conn, deadline, limit)
            except CONNECTION_ERRORS as exc:
                # The first connection's error is the caller's to see (a wrong alias, the
                # database down); a connection lost during the wait is made again, and the
                # job read again once it listens (an end in between was not notified to it).
                left = _left(deadline)
                if not listened or (left is not None and left <= 0):
                    raise
                pause = delay * (0.5 + random.random())
                logger.warning(
                    "job=%d event=result_wait_reconnect error=%r retry_in=%.1fs",
                    self.job_id,
                    " ".join(str(exc).split()),
                    pause,
                )
                time.sleep(pause if left is None else min(pause, left))
                delay = min(delay * 2, 5.0)

    def _watch(self, conn: psycopg.Connection, deadline: float | None, limit: float | None) -> Any:
        """Read the job, and sleep on ``conn`` (listening) until it ends or time is up."""
        recheck = float(pgqueue_settings.RESULT_RECHECK_SECONDS)
        while True:
            status, result_json, last_error = self._read(conn)
            if status == "done":
                return None if result_json is None else json.loads(result_json)
            if status in ("dead", "cancelled"):
                raise JobFailed(self.job_id, status, last_error)
            left = _left(deadline)
            if left is not None and left <= 0:
                assert limit is not None
                raise ResultTimeout(self.job_id, status, limit)
            self._sleep(conn, recheck if left is None else min(recheck, left))

    def _read(self, conn: psycopg.Connection) -> tuple[str, str | None, str | None]:
        """The job's status, result (JSON text) and last error, read on ``conn``."""
        self.reads += 1
        row = conn.execute(sql.JOB_GET_OUTCOME, {"id": self.job_id}).fetchone()
        if row is None:
            if self._enqueued_in_open_transaction():
                raise JobNotCommitted(self.job_id, self.alias)
            raise JobNotFound(f"job {self.job_id} does not exist")
        return row[0], row[1], row[2]

    def _sleep(self, conn: psycopg.Connection, seconds: float) -> None:
        """Until a notification names the job, or ``seconds`` pass. Notifications of other
        jobs are read and passed over (a payload is at most 400 ids)."""
        wanted = str(self.job_id)
        for note in conn.notifies(timeout=seconds):
            if note.channel == FINISHED_CHANNEL and wanted in note.payload.split(","):
                self.wakeups += 1
                return

    def _enqueued_in_open_transaction(self) -> bool:
        """Whether the job, not visible to other connections, is visible in the caller's
        own open transaction on the alias: enqueued there and not committed yet."""
        caller = connections[self.alias]
        if not caller.in_atomic_block or caller.needs_rollback:
            return False
        with caller.cursor() as cur:
            cur.execute(sql.JOB_GET_OUTCOME, {"id": self.job_id})
            return cur.fetchone() is not None


def _job_id(value: Any) -> int:
    """A job id as an int; JobNotFound for one no job can have, ValueError for no id."""
    if isinstance(value, bool):
        raise ValueError(f"job_id: must be a job's id (an integer), got {value!r}")
    try:
        job_id = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"job_id: must be a job's id (an integer), got {value!r}") from None
    if not 1 <= job_id <= MAX_JOB_ID:
        raise JobNotFound(f"job {job_id} does not exist")
    return job_id


def _timeout(value: Any) -> float | None:
    """Seconds to wait (None: no bound); ValueError naming ``timeout`` for anything else."""
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(
            f"timeout: must be None or a number of seconds >= 0 (or a timedelta), got {value!r}"
        )
    return float(value)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()
