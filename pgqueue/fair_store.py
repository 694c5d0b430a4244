"""Runs the statements of fairness by worker time that are not a choice of an existing one.

The enqueue and promotion statements by time are chosen in ``pgqueue.store`` (see
``fairness.statement``); what is left is maintenance's correction of the clocks.
"""

from __future__ import annotations

from typing import Any

from . import sql
from .store import FOLD_SETTLE_SECONDS


def correct_fair_clocks(cursor: Any, *, limit: int = 10_000, settle: float | None = None) -> int:
    """Move tenants' clocks by the error of their settled attempts' charges
    (FAIR_CLOCK_CORRECT); returns the new mark (0: nothing read).

    The same settle delay as the task-stat fold: an attempt id is given out before its
    transaction commits, so a row younger than that could still appear below the mark.
    """
    cursor.execute(
        sql.FAIR_CLOCK_CORRECT,
        {"limit": limit, "settle": FOLD_SETTLE_SECONDS if settle is None else settle},
    )
    row = cursor.fetchone()
    return row[0] if row else 0
