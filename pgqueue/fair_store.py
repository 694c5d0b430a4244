"""Runs the statements of maintenance on the fair clocks that are not a choice of an
existing one: the correction of fairness by worker time, and the prune of idle clocks.

The enqueue and promotion statements by time are chosen in ``pgqueue.store`` (see
``fairness.statement``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import sql
from .conf import pgqueue_settings
from .fairness import by_time

#: Attempt rows younger than this are left for the next correction (FAIR_CLOCK_CORRECT).
#: The time window can skip an attempt whose transaction commits after a larger id was
#: read (the metrics fold waits on the transaction horizon instead); a skipped
#: correction only leaves that one job's estimate error on its tenant's clock.
SETTLE_SECONDS = 5.0

#: Where a walk of the levels (queue, priority) starts over: before every level (queue
#: names are never empty).
FIRST_LEVEL = ("", -32768)


def correct_fair_clocks(cursor: Any, *, limit: int = 10_000, settle: float | None = None) -> int:
    """Move tenants' clocks by the error of their settled attempts' charges
    (FAIR_CLOCK_CORRECT); returns the new mark (0: nothing read).

    A settle delay (SETTLE_SECONDS): an attempt id is given out before its transaction
    commits, so a row younger than that could still appear below the mark.
    """
    cursor.execute(
        sql.FAIR_CLOCK_CORRECT,
        {"limit": limit, "settle": SETTLE_SECONDS if settle is None else settle},
    )
    row = cursor.fetchone()
    return row[0] if row else 0


class Pruned(NamedTuple):
    """What one prune of idle clocks did: the clocks deleted, each (queue, tenant, priority,
    vtime), and the level the next prune goes on after (None: from the first)."""

    deleted: list[tuple[str, str, int, float]]
    after: tuple[str, int] | None


def prune_fair_clocks(
    cursor: Any,
    *,
    after: tuple[str, int] | None = None,
    levels: int | None = None,
    limit: int | None = None,
) -> Pruned:
    """Delete the idle fair clocks of up to ``levels`` levels (queue, priority) after
    ``after`` (None: from the first), at most ``limit`` rows (both default to
    MAINTENANCE_BATCH_SIZE): FAIR_CLOCK_LOCK_IDLE, then, if it locked any row,
    FAIR_CLOCK_DELETE_IDLE (two round trips), in the caller's transaction, which must be
    READ COMMITTED: the second statement's snapshot must be newer than the locks.

    A clock goes only when no future vtime depends on it (see "Idle fair clocks" in
    ``pgqueue.sql``), so the order of claims is the same with or without the prune.
    """
    batch = int(pgqueue_settings.MAINTENANCE_BATCH_SIZE)
    levels = batch if levels is None else levels
    start = FIRST_LEVEL if after is None else after
    by_vtime = pgqueue_settings.ORDERING == "fair" and not by_time()
    timed = by_time()
    cursor.execute(
        sql.FAIR_CLOCK_LOCK_IDLE_BY_TIME if timed else sql.FAIR_CLOCK_LOCK_IDLE,
        {
            "after_queue": start[0],
            "after_priority": start[1],
            "levels": levels,
            "limit": batch if limit is None else limit,
            "by_vtime": by_vtime,
        },
    )
    ids, walked, full, last_queue, last_priority = cursor.fetchone()
    last = None if last_queue is None else (last_queue, last_priority)
    if full:  # the limit cut a level short: go on from it
        next_after = last if last is not None else after
    else:
        next_after = last if walked >= levels else None
    if not ids:
        return Pruned([], next_after)
    cursor.execute(
        sql.FAIR_CLOCK_DELETE_IDLE_BY_TIME if timed else sql.FAIR_CLOCK_DELETE_IDLE,
        {"ids": list(ids), "by_vtime": by_vtime},
    )
    deleted = [(q, t, p, v) for q, t, p, v in cursor.fetchall()]
    return Pruned(deleted, next_after)
