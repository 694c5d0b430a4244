"""Runs the claim statements of ``pgqueue/queries/claim.sql``: LIMIT_LOCK_TURN and
JOB_CLAIM, with the outcomes of a turn (JOB_COMPLETE_MANY, JOB_FAIL_MANY) between them.

A turn is one transaction and one round trip (``turn``: psycopg's pipeline mode): lock
what it changes, record the outcomes, claim. ``claim`` and ``complete_and_claim`` (what
``pgqueue.store`` offers) run the same statements on a caller's cursor, in the caller's
transaction.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg

from . import key_store, sql
from .conf import pgqueue_settings
from .queries import load


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job as a worker holds it: enough to run it and to fence what it writes back."""

    id: int
    task: str
    payload: Any
    tenant: str
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    lease_expires_at: dt.datetime
    vtime: float
    timeout: float | None = None  # seconds from the handler's start (pgqueue.timeouts)
    #: The pgqueue_limit rows it is counted in (None: none); its exit must decrement them.
    limit_ids: list[int] | None = None
    #: Leases it lost before its start was recorded (each given back uncounted): the
    #: worker has its start written before its handler runs (worker/executor.py).
    lost_claims: int = 0
    #: Its concurrency key (None: none); its exit gives a slot of the key back (KEY_SETTLE).
    concurrency_key: str | None = None
    #: The workflow it is a step of and the step's name (None: none).
    workflow_id: int | None = None
    step: str | None = None
    #: The W3C trace context it was enqueued in (None: none recorded): its attempt's span
    #: is a child of it (pgqueue.tracing).
    traceparent: str | None = None
    tracestate: str | None = None


def lease(lease_seconds: float | None) -> float:
    return float(pgqueue_settings.LEASE_SECONDS if lease_seconds is None else lease_seconds)


class Success(NamedTuple):
    """A success to record: the job, the attempt that ran, its result (JSON text or None)
    and when its handler began and ended, in the database's clock (``worker.clock``).
    Without the times (a caller that ran no handler) the attempt is recorded as running
    from its claim until the statement."""

    id: int
    attempt: int
    result: str | None
    started: dt.datetime | None = None
    finished: dt.datetime | None = None


def complete_params(results: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The completion's arrays; each of ``results`` is a ``Success`` or a tuple of its
    first fields (``(id, attempt, result)``)."""
    rows = [Success(*r) for r in results]
    return {
        "ids": [r.id for r in rows],
        "attempts": [r.attempt for r in rows],
        "results": [r.result for r in rows],
        "started": [r.started for r in rows],
        "finished": [r.finished for r in rows],
    }


#: The statements of claim.sql, by name.
STATEMENTS = load("claim.sql")


def _params(
    worker: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float | None,
    now: dt.datetime | None,
) -> dict[str, Any]:
    """The parameters every claim statement takes (LIMIT_LOCK_TURN's ``ids`` empty)."""
    return {
        "queues": list(queues),
        "limit": limit,
        "worker": worker,
        "lease": lease(lease_seconds),
        "now": now,
        "ids": [],
    }


def _jobs(rows: Sequence[Sequence[Any]]) -> list[ClaimedJob]:
    """The claimed jobs of JOB_CLAIM's rows, best first."""
    jobs = [ClaimedJob(r[0], r[1], json.loads(r[2]), *r[3:18]) for r in rows]
    jobs.sort(key=lambda j: (-j.priority, j.vtime, j.id))
    return jobs


def fail_params(failures: Sequence[Any]) -> dict[str, Any]:
    """JOB_FAIL_MANY's arrays and backoff for ``failures`` (``store.Failure``)."""
    return {
        "ids": [f.id for f in failures],
        "attempts": [f.attempt for f in failures],
        "errors": [f.error for f in failures],
        "tracebacks": [f.traceback for f in failures],
        "permanent": [f.permanent for f in failures],
        "started": [f.started for f in failures],
        "finished": [f.finished for f in failures],
        "retry_in": [f.retry_in for f in failures],
        "snooze": [f.snooze for f in failures],
        "backoff_base": float(pgqueue_settings.BACKOFF_BASE),
        "backoff_cap": float(pgqueue_settings.BACKOFF_CAP),
        "max_snoozes": int(pgqueue_settings.MAX_SNOOZES),
    }


def lock_turn(cursor: Any, *, worker: str, ids: Sequence[int], queues: Sequence[str] = ()) -> None:
    """LIMIT_LOCK_TURN on ``cursor``: before a transaction records outcomes of the jobs
    ``ids`` in more than one statement, so that it takes its limit rows in id order."""
    cursor.execute(
        STATEMENTS["LIMIT_LOCK_TURN"], {"worker": worker, "ids": list(ids), "queues": list(queues)}
    )
    cursor.fetchall()


def claim(
    cursor: Any,
    *,
    worker: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` runnable jobs, best first: JOB_CLAIM alone, one statement. It
    takes the queues' own limit rows SKIP LOCKED, as any other (a turn locks them first,
    waiting): a queue whose row another transaction holds offers nothing this once."""
    params = _params(worker, queues, limit, lease_seconds, now)
    cursor.execute(STATEMENTS["JOB_CLAIM"], params)
    return _jobs(cursor.fetchall())


def complete_and_claim(
    cursor: Any,
    *,
    worker: str,
    results: Sequence[Sequence[Any]],
    queues: Sequence[str],
    limit: int,
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
) -> tuple[set[int], list[ClaimedJob]]:
    """Record successes, give back their concurrency keys' slots (KEY_SETTLE) and claim
    up to ``limit`` jobs, at ``now``, as a turn does, on the caller's cursor (and in its
    transaction).

    Returns the ids recorded (the others were fenced out) and the claimed jobs.
    """
    params = _params(worker, queues, limit, lease_seconds, now)
    params.update(complete_params(results))
    cursor.execute(STATEMENTS["LIMIT_LOCK_TURN"], params)
    cursor.fetchall()
    cursor.execute(sql.JOB_COMPLETE_MANY, params)
    recorded = {row[0] for row in cursor.fetchall()}
    key_store.settle(cursor, sorted(recorded))
    cursor.execute(STATEMENTS["JOB_CLAIM"], params)
    return recorded, _jobs(cursor.fetchall())


class Turn(NamedTuple):
    """What a turn did."""

    recorded: set[int]  # the successes and failures recorded; the others were fenced out
    failed: dict[int, str]  # the failures recorded: {job id: its new status}
    jobs: list[ClaimedJob]  # the jobs claimed, best first
    examined: int = 0  # new keyed jobs KEY_SETTLE examined (``admit`` of them: look again)
    #: Successes a job waits for (JOB_COMPLETE_MANY's awaited): the worker settles their
    #: dependents once the turn has committed (pgqueue.workflow_store).
    awaited: frozenset[int] = frozenset()


def turn(
    db: psycopg.Connection,
    *,
    worker: str,
    queues: Sequence[str],
    limit: int,
    successes: Sequence[Success] = (),
    failures: Sequence[Any] = (),
    counted: Sequence[int] | None = None,
    settle: bool = False,
    admit: int = 0,
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
) -> Turn:
    """One turn of a worker, in one transaction and one round trip (pipeline mode):
    TURN_PLAN, LIMIT_LOCK_TURN, the successes (JOB_COMPLETE_MANY) and failures
    (JOB_FAIL_MANY), KEY_LOCK and KEY_SETTLE when ``settle`` (some outcome's job has a
    concurrency key), KEY_SETTLE alone for ``admit`` (new keyed jobs to examine, at most
    that many), and the claim of up to ``limit`` jobs (JOB_CLAIM), which takes the jobs
    KEY_SETTLE admitted too. ``counted``: the jobs among the outcomes counted in limit
    rows (None: not known, all are locked first). A statement the database refuses rolls
    the whole turn back and is raised."""
    params = _params(worker, queues, limit, lease_seconds, now)
    # The jobs to lock first: those counted in limit rows (their exits take limit rows'
    # locks); ``counted`` names them when the caller knows, else every one is locked.
    outcomes = [s.id for s in successes] + [f.id for f in failures]
    if counted is None:
        params["ids"] = outcomes
    else:
        counted = set(counted)
        params["ids"] = [i for i in outcomes if i in counted]
    steps: list[tuple[str, dict[str, Any]]] = [
        (STATEMENTS["TURN_PLAN"], {}),
        (STATEMENTS["LIMIT_LOCK_TURN"], params),
    ]
    if successes:
        steps.append((sql.JOB_COMPLETE_MANY, {**params, **complete_params(successes)}))
    if failures:
        steps.append((sql.JOB_FAIL_MANY, {**params, **fail_params(failures)}))
    if settle or admit > 0:
        settle_params = key_store.settle_params(outcomes if settle else (), admit)
        if settle:
            steps.append((key_store.STATEMENTS["KEY_LOCK"], settle_params))
        steps.append((key_store.STATEMENTS["KEY_SETTLE"], settle_params))
    if limit > 0:
        steps.append((STATEMENTS["JOB_CLAIM"], params))
    # Sent together, with one Sync at the end: PostgreSQL runs the statements up to a Sync
    # as one implicit transaction, committed at the Sync, or rolled back whole if one fails
    # (psycopg's transaction() would sync before COMMIT and again after: three round trips).
    assert db.autocommit, "a turn is its own transaction"
    cursors = []
    with db.pipeline():
        for statement, step_params in steps:
            cursors.append(db.cursor())
            # The keys' statements are planned at each run (key_store.PLANNED_EACH_TIME).
            prepare = False if statement in key_store.PLANNED_EACH_TIME else None
            cursors[-1].execute(statement, step_params, prepare=prepare)
    results = [c.fetchall() for c in cursors]
    for c in cursors:
        c.close()
    recorded: set[int] = set()
    failed: dict[int, str] = {}
    at = 2
    awaited: frozenset[int] = frozenset()
    if successes:
        recorded |= {row[0] for row in results[at]}
        awaited = frozenset(row[0] for row in results[at] if row[1])
        at += 1
    if failures:
        failed = {row[0]: row[1] for row in results[at]}
        recorded |= set(failed)
        at += 1
    examined = 0
    if settle:
        at += 1  # KEY_LOCK
    if settle or admit > 0:
        examined = int(results[at][0][0])
        at += 1
    return Turn(recorded, failed, _jobs(results[at]) if limit > 0 else [], examined, awaited)
