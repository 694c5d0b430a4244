"""Runs the named statements of cancelling running jobs and of timeouts (``pgqueue.sql``,
"Cancelling a running job, and timeouts"), as ``pgqueue.store`` does for the hot path: one
round trip per function, on the caller's cursor and transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from . import key_store, sql, store
from .conf import pgqueue_settings


def cancel(cursor: Any, ids: list[int], *, asked: list[int]) -> list[int]:
    """Cancel the waiting jobs of ``ids`` (JOB_CANCEL_MANY), give back the concurrency
    keys' slots they held (KEY_SETTLE) and ask the running ones to stop
    (JOB_CANCEL_REQUEST_MANY, appended to ``asked``): up to three round trips. Returns
    both."""
    cancelled = store.cancel_many(cursor, ids)
    asked.extend(request_cancel_many(cursor, sorted(set(ids) - set(cancelled))))
    if cancelled:  # a job that held its concurrency key's slot gives it back
        key_store.settle(cursor, cancelled)
    return cancelled + asked


def request_cancel_many(cursor: Any, ids: Sequence[int]) -> list[int]:
    """Ask running jobs to stop (JOB_CANCEL_REQUEST_MANY); returns the ids asked."""
    cursor.execute(
        sql.JOB_CANCEL_REQUEST_MANY,
        {"ids": list(ids), "channel": pgqueue_settings.NOTIFY_CHANNEL},
    )
    return [row[0] for row in cursor.fetchall()]


def confirm_cancel_many(
    cursor: Any,
    *,
    worker: str,
    held: Sequence[tuple[int, int]],
    now: dt.datetime | None = None,
    started: Mapping[int, dt.datetime] | None = None,
) -> set[int]:
    """End the attempts of held jobs asked to stop (JOB_CANCEL_CONFIRM_MANY); returns the
    ids cancelled (the others had been recorded first, or were lost). ``started``: the
    start of each job whose handler had begun."""
    started = started or {}
    cursor.execute(
        sql.JOB_CANCEL_CONFIRM_MANY,
        {
            "worker": worker,
            "ids": [h[0] for h in held],
            "attempts": [h[1] for h in held],
            "started": [started.get(h[0]) for h in held],
            "now": now,
        },
    )
    return {row[0] for row in cursor.fetchall()}


def reap_cancelled(
    cursor: Any, *, limit: int | None = None, now: dt.datetime | None = None
) -> list[int]:
    """Cancel the jobs asked to stop whose lease ran out (JOB_REAP_CANCELLED)."""
    cursor.execute(
        sql.JOB_REAP_CANCELLED,
        {"limit": limit or pgqueue_settings.MAINTENANCE_BATCH_SIZE, "now": now},
    )
    return [row[0] for row in cursor.fetchall()]


def reap_timed_out(
    cursor: Any,
    *,
    grace: float | None = None,
    limit: int | None = None,
    now: dt.datetime | None = None,
) -> dict[int, str]:
    """Fail the jobs held past their deadline by ``grace`` seconds (default: the lease)
    whose worker did not record it (JOB_REAP_TIMED_OUT); ``{job id: new status}``."""
    cursor.execute(
        sql.JOB_REAP_TIMED_OUT,
        {
            "grace": float(pgqueue_settings.LEASE_SECONDS if grace is None else grace),
            "limit": limit or pgqueue_settings.MAINTENANCE_BATCH_SIZE,
            "now": now,
            "backoff_base": float(pgqueue_settings.BACKOFF_BASE),
            "backoff_cap": float(pgqueue_settings.BACKOFF_CAP),
        },
    )
    return {row[0]: row[1] for row in cursor.fetchall()}
