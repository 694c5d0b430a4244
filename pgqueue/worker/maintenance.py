"""Maintenance: the queue's background duties, run by one worker at a time.

- ``rescue_expired_leases``: a job whose lease ran out (its worker crashed, was killed or
  stalled) is taken back: scheduled again with backoff, or dead when out of attempts.
- ``promote_due_jobs``: scheduled jobs whose run_at has come (delays, backoffs) become
  runnable, each with a fresh fair vtime, and their queues are notified.
- ``prune_dead_workers``: worker rows not seen for a day leave the registry.
- ``fold_task_stats``: finished attempts are folded into the per-task totals of the metrics.
- ``enqueue_due_periodic``: each due periodic schedule enqueues its tick's job (one per
  tick, held so by the job's idempotency key) and moves on to its next tick.

Who and how often: every worker's loop calls ``run_maintenance`` when it starts and then
about once per ``MAINTENANCE_SECONDS`` (jittered, so workers do not try in step; not while
stopping). A transaction-scoped advisory lock lets exactly one of them do the work each
time, and a worker that dies mid-run releases it with its transaction. The duties run in
that one transaction, in the order above. Rescue and promotion take their rows with SKIP
LOCKED (at most ``MAINTENANCE_BATCH_SIZE`` each per run) and promotion locks tenant clocks
in sorted order, so maintenance never deadlocks with enqueues or with itself.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from .. import store
from ..schedules import Fired, enqueue_due

logger = logging.getLogger("pgqueue.worker")


@dataclass
class MaintenanceResult:
    ran: bool  # False: another worker held the lock, nothing was done
    rescued: dict[int, str]
    promoted: list[int]


def run_maintenance(conn: Any) -> MaintenanceResult:
    """One maintenance pass on ``conn`` (a psycopg connection in autocommit mode)."""
    with conn.transaction(), conn.cursor() as cur:
        if not store.try_maintenance_lock(cur):
            return MaintenanceResult(False, {}, [])
        rescued = rescue_expired_leases(cur)
        promoted = promote_due_jobs(cur)
        prune_dead_workers(cur)
        fold_task_stats(cur)
        enqueue_due_periodic(cur)
    # Logged once committed: a pass that rolled back rescued and promoted nothing.
    for job_id, status in rescued.items():
        logger.warning("job=%d event=lease_expired new_status=%s", job_id, status)
    if promoted:
        logger.debug("event=promoted count=%d", len(promoted))
    return MaintenanceResult(True, rescued, promoted)


# Each duty runs on the cursor of run_maintenance's transaction, under its advisory lock.


def rescue_expired_leases(cur: Any) -> dict[int, str]:
    """Take back jobs whose worker died or stalled past its lease; ``{job id: new status}``.

    Each expiry counts as an attempt, so a job that crashes every worker that runs it ends
    dead instead of going round forever. The worker that held it is fenced out: whatever
    it records later for that attempt is discarded.
    """
    return store.reap_expired(cur)


def promote_due_jobs(cur: Any) -> list[int]:
    """Make due scheduled jobs runnable; returns their ids.

    Each gets a fresh fair vtime, so a job back from a backoff does not jump the line.
    """
    return store.promote_due(cur)


def prune_dead_workers(cur: Any) -> None:
    """Forget worker rows not seen for a day: the registry is for the living."""
    store.prune_workers(cur)


def fold_task_stats(cur: Any) -> int:
    """Fold settled attempts into the per-task totals; returns the new mark (0: none).

    The metrics endpoint then reads a few rows per task, not the whole attempt history.
    """
    return store.fold_task_stats(cur)


def enqueue_due_periodic(cur: Any, now: dt.datetime | None = None) -> list[Fired]:
    """Enqueue the job of each due periodic schedule's tick; returns what each did.

    Through ``store.enqueue``, so the tenant's fair clock is charged as for any job. A tick
    missed while no worker ran becomes one job, or none (``missed="skip"``), not a burst.
    """
    return enqueue_due(cur, now=now)
