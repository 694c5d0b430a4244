"""Runs KEY_LOCK and KEY_SETTLE (``pgqueue/queries/keys.sql``): concurrency keys' slots
given back, handed on and taken. docs/explanation/architecture.md, "Concurrency keys", has
the design.

One ``settle`` per transaction, after the statements that end its jobs: it takes key rows
in key order, and a second one in the same transaction could take them out of order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from .conf import pgqueue_settings
from .queries import load

#: The statements of keys.sql, by name.
STATEMENTS = load("keys.sql")

#: Never prepared: planned at each run, for the key table's size then. pgqueue_key grows
#: and shrinks by a row per key in use; a generic plan cached while it was nearly empty
#: scans it whole (13 ms a settle at 5,000 keys, growing with them), where a plan made for
#: its size looks each key up by pgqueue_key_uniq.
PLANNED_EACH_TIME = frozenset(STATEMENTS.values())


def settle_params(ids: Sequence[int] = (), admit: int = 0) -> dict[str, Any]:
    """KEY_SETTLE's parameters: give back the slots of the finished jobs among ``ids`` and
    examine up to ``admit`` new keyed jobs."""
    return {
        "ids": list(ids),
        "admit": admit,
        "dead_holds": bool(pgqueue_settings.DEAD_JOB_HOLDS_KEY),
        "channel": pgqueue_settings.NOTIFY_CHANNEL,
    }


def settle(cursor: Any, ids: Sequence[int] = (), *, admit: int = 0) -> int:
    """KEY_LOCK (when ``ids`` are given) and KEY_SETTLE on ``cursor``, in the caller's
    transaction, which must hold the rows of ``ids`` already (it has just ended those
    jobs). Returns how many new keyed jobs it examined: ``admit`` of them means more may
    be waiting to be examined."""
    params = settle_params(ids, admit)
    if not params["ids"] and admit <= 0:
        return 0  # nothing ended and nothing to examine: no statement
    if params["ids"]:
        _execute(cursor, STATEMENTS["KEY_LOCK"], params)
        cursor.fetchall()
    _execute(cursor, STATEMENTS["KEY_SETTLE"], params)
    return int(cursor.fetchone()[0])


def _execute(cursor: Any, statement: str, params: dict[str, Any]) -> None:
    """Run one of PLANNED_EACH_TIME unprepared on a psycopg cursor (Django's cursor wraps
    one and prepares nothing of its own accord)."""
    if isinstance(cursor, psycopg.Cursor):
        cursor.execute(statement, params, prepare=False)
    else:
        cursor.execute(statement, params)
