"""Maintenance: reap expired leases and promote due scheduled jobs, one worker at a time.

Every worker tries about once per ``MAINTENANCE_SECONDS``; a transaction-scoped advisory
lock lets exactly one of them do the work, and a worker that dies mid-run releases it with
its transaction. Both statements take their rows with SKIP LOCKED and lock tenant clocks
in sorted order, so maintenance never deadlocks with enqueues or with itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .. import store

logger = logging.getLogger("pgqueue.worker")


@dataclass
class MaintenanceResult:
    ran: bool
    reaped: dict[int, str]
    promoted: list[int]


def run_maintenance(conn: Any) -> MaintenanceResult:
    """One maintenance pass on ``conn`` (a psycopg connection in autocommit mode)."""
    with conn.transaction(), conn.cursor() as cur:
        if not store.try_maintenance_lock(cur):
            return MaintenanceResult(False, {}, [])
        reaped = store.reap_expired(cur)
        promoted = store.promote_due(cur)
        store.prune_workers(cur)
        store.fold_task_stats(cur)
    for job_id, status in reaped.items():
        logger.warning("job=%d event=lease_expired new_status=%s", job_id, status)
    if promoted:
        logger.debug("event=promoted count=%d", len(promoted))
    return MaintenanceResult(True, reaped, promoted)
