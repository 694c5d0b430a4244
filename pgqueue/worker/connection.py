"""Dedicated psycopg connections for the worker, built from Django's DATABASES entry.

The worker does not use Django's connection for its own bookkeeping: LISTEN needs a
session of its own, and the claim/record loop must not share a connection (or its
transaction state) with handlers that use the ORM on other threads.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connections

from ..conf import queue_db

logger = logging.getLogger("pgqueue.worker")

# Errors after which a connection is presumed broken and is made again.
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


class DatabaseUnreachable(Exception):
    """The worker could not reach the database at start-up (a connection error each try)."""

    def __init__(self, attempts: int, reason: str) -> None:
        super().__init__(f"cannot reach the database after {attempts} attempt(s): {reason}")
        self.attempts = attempts
        self.reason = reason


# Django-specific keys of get_connection_params() that psycopg.connect does not take, or
# that the worker sets itself (it uses server-side binding and prepared statements).
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")


def connect_params(alias: str | None = None, application_name: str = "pgqueue") -> dict[str, Any]:
    """psycopg.connect's keywords for ``alias`` (None: ``PGQUEUE["DATABASE"]``), from the
    DATABASES entry through Django's backend, so OPTIONS, the service file and the
    password are read as Django reads them."""
    params = connections[queue_db(alias)].get_connection_params()
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    params.setdefault("application_name", application_name)
    return params


def connect(params: dict[str, Any], *, autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(**params, autocommit=autocommit, connect_timeout=10)


def connect_until_up(
    params: dict[str, Any],
    *,
    stopping: threading.Event,
    on_connect: Callable[[psycopg.Connection], None],
    attempts: int | None = None,
    tick: Callable[[], None] | None = None,
) -> psycopg.Connection | None:
    """A connection, retried with jittered backoff (0.1 s doubling to 5 s) while it fails.

    ``on_connect`` runs on each new connection (the worker registers itself); a connection
    error in it counts as a failed try. Returns None, at once, when ``stopping`` is set
    first: the waits between tries are on that event, so SIGTERM is honoured even while the
    database is down. After ``attempts`` failed tries (None: no bound) raises
    ``DatabaseUnreachable``. ``tick`` is called before each try and at least once a second
    while waiting for the next, on the calling thread: the worker's loop marks its health
    file with it (``pgqueue.worker.health``), since waiting for the database is not being
    stuck.
    """
    delay = 0.1
    tried = 0
    while not stopping.is_set():
        if tick is not None:
            tick()
        db: psycopg.Connection | None = None
        try:
            db = connect(params)
            on_connect(db)
            return db
        except CONNECTION_ERRORS as exc:
            if db is not None:
                db.close()
            tried += 1
            reason = " ".join(str(exc).split())
            if attempts is not None and tried >= attempts:
                raise DatabaseUnreachable(tried, reason) from exc
            logger.warning("event=db_unavailable error=%r retry_in=%.1fs", reason, delay)
            _wait(stopping, delay * (0.5 + random.random()), tick)
            delay = min(delay * 2, 5.0)
    return None


def _wait(stopping: threading.Event, seconds: float, tick: Callable[[], None] | None) -> None:
    """Wait ``seconds`` or until ``stopping`` is set, calling ``tick`` every second."""
    if tick is None:
        stopping.wait(seconds)
        return
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and not stopping.wait(min(left, 1.0)):
        tick()


def error_text(exc: BaseException) -> str:
    """A database error on one line: its class and first line of message (for logs)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
