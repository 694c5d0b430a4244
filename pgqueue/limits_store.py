"""Runs the limit statements of ``pgqueue/queries/limits.sql`` (LIMIT_*, JOB_GATE_SCOPE, ...).

As ``pgqueue.store``: each function takes an open DB-API cursor and does one round trip
unless its docstring says otherwise; transactions are the caller's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .conf import pgqueue_settings
from .queries import load

#: The statements of limits.sql, by name.
STATEMENTS = load("limits.sql")

#: Marks a limit field the caller leaves as it is.
UNSET: Any = object()


def set_limit(
    cursor: Any,
    *,
    queue: str,
    tenant: str,
    max_running: int | None = UNSET,
    rate: tuple[int, int] | None = UNSET,
    paused: bool | None = None,
) -> tuple[int, bool]:
    """Upsert one scope's row (LIMIT_SET); ``(row id, limits anything now)``."""
    cursor.execute(
        STATEMENTS["LIMIT_SET"],
        {
            "queue": queue,
            "tenant": tenant,
            "set_max": max_running is not UNSET,
            "max_running": None if max_running is UNSET else max_running,
            "set_rate": rate is not UNSET,
            "rate_count": None if rate is UNSET or rate is None else rate[0],
            "rate_seconds": None if rate is UNSET or rate is None else rate[1],
            "paused": paused,
        },
    )
    row = cursor.fetchone()
    return row[0], bool(row[1])


def regate(cursor: Any, *, tenant: str, queue: str, gate: bool, limit: int) -> int:
    """Gate (JOB_GATE_SCOPE) or ungate (JOB_UNGATE_SCOPE) up to ``limit`` queued jobs of a
    tenant scope; returns how many changed."""
    statement = STATEMENTS["JOB_GATE_SCOPE"] if gate else STATEMENTS["JOB_UNGATE_SCOPE"]
    cursor.execute(statement, {"tenant": tenant, "queue": queue, "limit": limit})
    return len(cursor.fetchall())


def notify(cursor: Any, *, queue: str) -> None:
    """Wake the workers of ``queue`` ('' : of every queue served) on commit."""
    cursor.execute(
        STATEMENTS["QUEUE_NOTIFY_SERVED"],
        {"queue": queue, "channel": pgqueue_settings.NOTIFY_CHANNEL},
    )


def next_token_in(
    cursor: Any, queues: Sequence[str], *, now: dt.datetime | None = None
) -> float | None:
    """Seconds until a rate-limited scope of ``queues`` has its next token (None: none)."""
    cursor.execute(STATEMENTS["LIMIT_NEXT_TOKEN"], {"queues": list(queues), "now": now})
    row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


def recount(cursor: Any) -> list[tuple[int, int, int]]:
    """Recount the ``running`` of the rows whose counter drifted: found in one snapshot
    without a lock (LIMIT_DRIFTED), then locked (LIMIT_LOCK_MANY) and recounted with a
    fresh snapshot (LIMIT_RECOUNT); one round trip when nothing drifted. In the caller's
    transaction, which must be READ COMMITTED. Returns ``(row id, was, now)`` of the rows
    corrected."""
    cursor.execute(STATEMENTS["LIMIT_DRIFTED"])
    ids = [r[0] for r in cursor.fetchall()]
    if not ids:
        return []
    cursor.execute(STATEMENTS["LIMIT_LOCK_MANY"], {"ids": ids})
    cursor.fetchall()
    cursor.execute(STATEMENTS["LIMIT_RECOUNT"], {"ids": ids})
    return [(r[0], r[1], r[2]) for r in cursor.fetchall()]


def delete_unused(cursor: Any) -> list[int]:
    """Delete the rows that limit nothing, count nothing and hold back no gated job
    (LIMIT_DELETE_UNUSED), so the claims of their queues go back to the plain statement.
    It locks only the rows it deletes. Returns their ids."""
    cursor.execute(STATEMENTS["LIMIT_DELETE_UNUSED"])
    return [r[0] for r in cursor.fetchall()]
