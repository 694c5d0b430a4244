"""Runs the named statements of the periodic schedules (``pgqueue_periodic``; ``PERIODIC_*``
in ``pgqueue.sql``) for ``pgqueue.schedules``, as ``pgqueue.store`` does for jobs: one round
trip per function, on the caller's cursor and transaction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from . import sql
from .conf import pgqueue_settings


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A due periodic schedule, as the maintenance duty fires it."""

    name: str
    cron: str
    timezone: str
    task: str
    tenant: str
    queue: str
    priority: int
    max_attempts: int
    payload_json: str
    missed: str
    next_run_at: dt.datetime


def periodic_sync(cursor: Any, *, specs_json: str) -> list[str]:
    """Upsert the declared schedules, mark the others removed (PERIODIC_SYNC).

    Returns the names newly marked removed.
    """
    cursor.execute(sql.PERIODIC_SYNC, {"specs": specs_json})
    return [row[0] for row in cursor.fetchall()]


def periodic_lock_due(
    cursor: Any, *, now: dt.datetime | None = None, limit: int | None = None
) -> list[DueSchedule]:
    """Lock the due live schedules, earliest first (PERIODIC_LOCK_DUE)."""
    cursor.execute(
        sql.PERIODIC_LOCK_DUE,
        {"now": now, "limit": limit or pgqueue_settings.MAINTENANCE_BATCH_SIZE},
    )
    return [DueSchedule(*row) for row in cursor.fetchall()]


def periodic_advance(
    cursor: Any,
    *,
    name: str,
    due: dt.datetime,
    next_run_at: dt.datetime,
    tick: dt.datetime | None,
    job_id: int | None,
) -> bool:
    """Move a schedule from ``due`` to ``next_run_at`` (PERIODIC_ADVANCE); False if it
    was no longer at ``due``."""
    cursor.execute(
        sql.PERIODIC_ADVANCE,
        {"name": name, "due": due, "next_run_at": next_run_at, "tick": tick, "job_id": job_id},
    )
    return cursor.fetchone() is not None


def periodic_lock(cursor: Any, *, name: str) -> tuple[str, str, bool] | None:
    """``(cron, timezone, enabled)`` of a schedule, its row locked (PERIODIC_LOCK)."""
    cursor.execute(sql.PERIODIC_LOCK, {"name": name})
    row = cursor.fetchone()
    return (row[0], row[1], row[2]) if row else None


def periodic_set_enabled(
    cursor: Any, *, name: str, enabled: bool, next_run_at: dt.datetime
) -> None:
    cursor.execute(
        sql.PERIODIC_SET_ENABLED, {"name": name, "enabled": enabled, "next_run_at": next_run_at}
    )
