"""Runs the named statements of retention (``JOB_PRUNE_FINISHED*`` in ``pgqueue.sql``) for
maintenance's ``prune_finished_jobs`` and ``manage.py pgqueue prune``, as ``pgqueue.store``
does for the hot path: one round trip per function, on the caller's cursor and transaction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from . import sql
from .conf import pgqueue_settings


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one prune statement removed (or, counting, would remove)."""

    jobs: int
    attempts: int


def _prune_params(
    status: str, keep_seconds: float, limit: int | None, now: dt.datetime | None
) -> dict[str, Any]:
    return {
        "status": status,
        "keep": float(keep_seconds),
        "limit": limit or pgqueue_settings.PRUNE_BATCH_SIZE,
        "now": now,
    }


def prune_finished(
    cursor: Any,
    *,
    status: str,
    keep_seconds: float,
    limit: int | None = None,
    now: dt.datetime | None = None,
) -> Pruned:
    """Delete one batch of ``status`` jobs finished over ``keep_seconds`` ago, with their
    attempts, skipping any that hold attempts not folded into the metrics yet
    (JOB_PRUNE_FINISHED)."""
    cursor.execute(sql.JOB_PRUNE_FINISHED, _prune_params(status, keep_seconds, limit, now))
    jobs, attempts = cursor.fetchone()
    return Pruned(jobs, attempts)


def count_prunable(
    cursor: Any,
    *,
    status: str,
    keep_seconds: float,
    limit: int,
    now: dt.datetime | None = None,
) -> Pruned:
    """What ``prune_finished`` would delete, counting at most ``limit`` jobs
    (JOB_PRUNE_FINISHED_COUNT)."""
    cursor.execute(sql.JOB_PRUNE_FINISHED_COUNT, _prune_params(status, keep_seconds, limit, now))
    jobs, attempts = cursor.fetchone()
    return Pruned(jobs, attempts)
