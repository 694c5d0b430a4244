"""Runs the statements of ``pgqueue/queries/workflows.sql``: workflows, dependencies, and
the settling of waiting jobs. workflows.sql's header says why settling is exact.

Every function takes an open DB-API cursor (Django's or a bare psycopg one) but
``settle_rounds``, which runs one transaction per round through the ``atomic`` it is
given, so that it serves the worker (psycopg) and the service layer (Django) alike.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any, NamedTuple

from . import store
from .conf import pgqueue_settings
from .exceptions import UpstreamTooLarge
from .queries import load

#: The statements of workflows.sql, by name.
STATEMENTS = load("workflows.sql")

#: Most rounds of ``settle_rounds``: each settles the dependents of the jobs the previous
#: one cancelled, so a cancellation walks down a graph a level a round. A workflow's graph
#: has at most MAX_WORKFLOW_JOBS levels; the rounds stop as soon as one cancels nothing.
MAX_SETTLE_ROUNDS = 100_000


#: Jobs promoted per JOB_PROMOTE_MANY: a fan-out's thousands of steps, settled at once,
#: are promoted in batches of this size (one statement over 10,000 ids took over 5 s here,
#: 10 of 1,000 a fraction of that).
PROMOTE_BATCH = 1000


class Upstream(NamedTuple):
    """A dependency of a job, as its handler sees it (``job.upstream``)."""

    id: int
    step: str | None
    status: str
    result: Any


def insert_workflow(cursor: Any, *, tenant: str, name: str) -> tuple[int, Any]:
    cursor.execute(STATEMENTS["WORKFLOW_INSERT"], {"tenant": tenant, "name": name})
    row = cursor.fetchone()
    return row[0], row[1]


def check_dependencies(cursor: Any, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """``{id: (tenant, status)}`` of the named jobs that exist, each locked FOR KEY SHARE
    until the caller's transaction ends (JOB_DEPENDENCY_CHECK)."""
    cursor.execute(STATEMENTS["JOB_DEPENDENCY_CHECK"], {"ids": list(ids)})
    return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def insert_dependencies(cursor: Any, edges: Iterable[tuple[int, int]]) -> None:
    """Insert ``(job, upstream)`` edges."""
    edges = list(edges)
    if edges:
        cursor.execute(
            STATEMENTS["JOB_DEPENDENCY_INSERT"],
            {"jobs": [e[0] for e in edges], "upstreams": [e[1] for e in edges]},
        )


def settle(
    cursor: Any,
    *,
    ids: Sequence[int] = (),
    upstreams: Sequence[int] = (),
    unpromoted: list[int] | None = None,
) -> dict[int, str]:
    """Settle the waiting jobs ``ids`` and the waiting dependents of ``upstreams``
    (JOB_SETTLE_WAITING), and promote those now runnable and due (JOB_PROMOTE_MANY), in
    the caller's transaction. Returns ``{job id: 'scheduled' or 'cancelled'}``; adds to
    ``unpromoted`` the due ones the promotion passed over (their tenant's fair clock was
    held by another transaction)."""
    if not ids and not upstreams:
        return {}
    cursor.execute(
        STATEMENTS["JOB_SETTLE_WAITING"], {"ids": list(ids), "upstreams": list(upstreams)}
    )
    rows = cursor.fetchall()
    due = [row[0] for row in rows if row[1] == "scheduled" and row[2]]
    skipped = _promote(cursor, due)
    if unpromoted is not None:
        unpromoted.extend(skipped)
    return {row[0]: row[1] for row in rows}


def _promote(cursor: Any, due: Sequence[int]) -> list[int]:
    """Promote ``due`` in batches of PROMOTE_BATCH; returns those passed over."""
    promoted: set[int] = set()
    for start in range(0, len(due), PROMOTE_BATCH):
        promoted.update(store.promote_ids(cursor, due[start : start + PROMOTE_BATCH]))
    return [i for i in due if i not in promoted]


def settle_rounds(
    atomic: Callable[[], ContextManager[Any]],
    *,
    ids: Sequence[int] = (),
    upstreams: Sequence[int] = (),
) -> dict[int, str]:
    """``settle``, then the dependents of what it cancelled, and so on down: one
    transaction a round (``atomic()`` opens one and yields a cursor), so a round never
    holds one level's locks while it waits for the next (settles lock in id order, round
    by round, and never deadlock with one another). Returns everything settled."""
    settled: dict[int, str] = {}
    for _ in range(MAX_SETTLE_ROUNDS):
        if not ids and not upstreams:
            break
        unpromoted: list[int] = []
        with atomic() as cursor:
            now = settle(cursor, ids=ids, upstreams=upstreams, unpromoted=unpromoted)
        if unpromoted:
            # Passed over because another transaction (an enqueue, another settle) held
            # their tenant's clock: one more try once this one has committed, which is
            # usually after the other's; what is still held waits for maintenance's
            # promotion (MAINTENANCE_SECONDS).
            with atomic() as cursor:
                _promote(cursor, unpromoted)
        settled.update(now)
        ids, upstreams = (), [i for i, status in now.items() if status == "cancelled"]
    return settled


def psycopg_atomic(conn: Any) -> Callable[[], ContextManager[Any]]:
    """``atomic`` for ``settle_rounds`` on a psycopg connection in autocommit mode."""

    @contextlib.contextmanager
    def atomic() -> Any:
        with conn.transaction(), conn.cursor() as cursor:
            yield cursor

    return atomic


def django_atomic(using: str) -> Callable[[], ContextManager[Any]]:
    """``atomic`` for ``settle_rounds`` on Django's connection ``using``."""
    from django.db import connections, transaction

    @contextlib.contextmanager
    def atomic() -> Any:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            yield cursor

    return atomic


def wait_again(cursor: Any, ids: Sequence[int]) -> list[int]:
    """The retried jobs ``ids`` that have dependencies wait for them again (JOB_WAIT_AGAIN)."""
    if not ids:
        return []
    cursor.execute(STATEMENTS["JOB_WAIT_AGAIN"], {"ids": list(ids)})
    return sorted(row[0] for row in cursor.fetchall())


def waiting_page(cursor: Any, *, after: int, limit: int) -> list[int]:
    cursor.execute(STATEMENTS["JOB_WAITING_PAGE"], {"after": after, "limit": limit})
    return [row[0] for row in cursor.fetchall()]


def resume(cursor: Any, ids: Sequence[int]) -> list[int]:
    """Make the dependents the end of ``ids`` cancelled wait again (JOB_RESUME_DEPENDENTS)."""
    if not ids:
        return []
    cursor.execute(STATEMENTS["JOB_RESUME_DEPENDENTS"], {"ids": list(ids)})
    return sorted(row[0] for row in cursor.fetchall())


def upstream(cursor: Any, job_id: int) -> list[Upstream]:
    """A job's dependencies with their status and result (JOB_UPSTREAM_RESULTS). Raises
    ``UpstreamTooLarge`` when their results together pass MAX_UPSTREAM_RESULT_BYTES."""
    limit = int(pgqueue_settings.MAX_UPSTREAM_RESULT_BYTES)
    cursor.execute(STATEMENTS["JOB_UPSTREAM_RESULTS"], {"id": job_id, "max_bytes": limit})
    rows = cursor.fetchall()
    total = sum(row[4] for row in rows)
    if total > limit:
        raise UpstreamTooLarge(job_id, len(rows), total, limit, [row[0] for row in rows])
    return [
        Upstream(row[0], row[1], row[2], None if row[3] is None else json.loads(row[3]))
        for row in rows
    ]
