"""Runs the statements of fairness by worker time that are not a choice of an existing one.

The enqueue and promotion statements by time are chosen in ``pgqueue.store`` (see
``fairness.statement``); what is left is maintenance's correction of the clocks.
"""

from __future__ import annotations

from typing import Any

from . import sql

#: Attempt rows younger than this are left for the next correction (FAIR_CLOCK_CORRECT).
#: The time window can skip an attempt whose transaction commits after a larger id was
#: read (the metrics fold waits on the transaction horizon instead); a skipped
#: correction only leaves that one job's estimate error on its tenant's clock.
SETTLE_SECONDS = 5.0


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
