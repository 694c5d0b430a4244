"""Runs the named statements of the periodic schedules (``pgqueue/queries/periodic.sql``:
``PERIODIC_*``, on ``pgqueue_periodic``) for ``pgqueue.schedules``, as ``pgqueue.store``
does for jobs: one round trip per function, on the caller's cursor and transaction.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from .conf import pgqueue_settings
from .queries import load

#: The statements of periodic.sql, by name.
STATEMENTS = load("periodic.sql")


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A periodic schedule as the maintenance duty fires it (and "run now" enqueues it)."""

    name: str
    cron: str | None
    every: dt.timedelta | None
    timezone: str
    task: str
    tenant: str
    queue: str
    priority: int
    max_attempts: int
    payload_json: str
    missed: str
    next_run_at: dt.datetime


@dataclass(frozen=True, slots=True)
class LockedSchedule:
    """What a change to a schedule reads of it, its row locked (PERIODIC_LOCK)."""

    cron: str | None
    every: dt.timedelta | None
    timezone: str
    enabled: bool
    source: str
    removed_at: dt.datetime | None
    next_run_at: dt.datetime


@dataclass(frozen=True, slots=True)
class SyncChanges:
    """What a start-up sync changed beyond the declared rows themselves."""

    removed: list[str]  # rows of the code no longer declared, newly marked removed
    taken: list[str]  # rows created in the admin whose name code now declares


def periodic_sync(cursor: Any, *, specs_json: str) -> SyncChanges:
    """Upsert the declared schedules, mark the code's others removed (PERIODIC_SYNC)."""
    cursor.execute(STATEMENTS["PERIODIC_SYNC"], {"specs": specs_json})
    changes = SyncChanges([], [])
    for what, name in cursor.fetchall():
        (changes.removed if what == "removed" else changes.taken).append(name)
    return changes


def periodic_lock_due(
    cursor: Any, *, now: dt.datetime | None = None, limit: int | None = None
) -> list[DueSchedule]:
    """Lock the due live schedules, earliest first (PERIODIC_LOCK_DUE)."""
    cursor.execute(
        STATEMENTS["PERIODIC_LOCK_DUE"],
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
        STATEMENTS["PERIODIC_ADVANCE"],
        {"name": name, "due": due, "next_run_at": next_run_at, "tick": tick, "job_id": job_id},
    )
    return cursor.fetchone() is not None


def periodic_get(cursor: Any, *, name: str) -> tuple[DueSchedule, dt.datetime | None] | None:
    """A schedule as the duty fires it, and when code stopped declaring it (PERIODIC_GET)."""
    cursor.execute(STATEMENTS["PERIODIC_GET"], {"name": name})
    row = cursor.fetchone()
    return (DueSchedule(*row[:-1]), row[-1]) if row else None


def periodic_lock(cursor: Any, *, name: str) -> LockedSchedule | None:
    """A schedule's cadence, switch, owner and next tick, its row locked (PERIODIC_LOCK)."""
    cursor.execute(STATEMENTS["PERIODIC_LOCK"], {"name": name})
    row = cursor.fetchone()
    return LockedSchedule(*row) if row else None


def periodic_set_enabled(
    cursor: Any, *, name: str, enabled: bool, next_run_at: dt.datetime
) -> None:
    """Turn a locked schedule on, from ``next_run_at``, or off (PERIODIC_SET_ENABLED)."""
    cursor.execute(
        STATEMENTS["PERIODIC_SET_ENABLED"],
        {"name": name, "enabled": enabled, "next_run_at": next_run_at},
    )


def periodic_insert(cursor: Any, *, row: dict[str, Any], enabled: bool) -> int | None:
    """Create an operator's schedule from a resolved row (``schedules.resolve``); its id,
    or None when the name is taken (PERIODIC_INSERT)."""
    cursor.execute(STATEMENTS["PERIODIC_INSERT"], _params(row, enabled))
    found = cursor.fetchone()
    return found[0] if found else None


def periodic_update(cursor: Any, *, row: dict[str, Any], enabled: bool) -> bool:
    """Replace an operator's schedule's definition, switch and next tick with a resolved
    row's; False when no such schedule of the admin exists (PERIODIC_UPDATE)."""
    cursor.execute(STATEMENTS["PERIODIC_UPDATE"], _params(row, enabled))
    return cursor.fetchone() is not None


def periodic_delete(cursor: Any, *, name: str) -> bool:
    """Delete an operator's schedule, or one code no longer declares (PERIODIC_DELETE)."""
    cursor.execute(STATEMENTS["PERIODIC_DELETE"], {"name": name})
    return cursor.fetchone() is not None


def _params(row: dict[str, Any], enabled: bool) -> dict[str, Any]:
    keys = ("name", "cron", "every_seconds", "timezone", "task", "tenant", "queue", "priority")
    params = {key: row[key] for key in (*keys, "max_attempts", "missed", "next_run_at")}
    params["payload"] = json.dumps(row["payload"], ensure_ascii=False)  # checked by resolve
    params["enabled"] = bool(enabled)
    return params
