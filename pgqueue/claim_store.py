"""Runs the claim statements of ``pgqueue.sql`` (JOB_CLAIM*, JOB_COMPLETE_AND_CLAIM*).

Two claims: the plain one (JOB_CLAIM, JOB_COMPLETE_AND_CLAIM and their several-queue
forms), the claim of before limits existed, which costs what it always did; and the
limited one (JOB_CLAIM_LIMITED, JOB_COMPLETE_AND_CLAIM_LIMITED), which counts the jobs it
starts in their limit rows under the rows' locks. Each checks once, in its own snapshot,
whether a limit row applies to the queues, and when it is the wrong one for that it says so
(a row of NULLs): the plain claim then claims nothing, the limited one claims as usual.
``claim_once`` runs one and reports the switch; ``claim`` and ``complete_and_claim`` (what
``pgqueue.store`` offers) start plain and follow a switch at once, so they are always right.

As ``pgqueue.store``, each function takes an open DB-API cursor; transactions are the
caller's. The worker's loop passes a ``psycopg.RawCursor`` (see _positional).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg

from . import sql
from .conf import pgqueue_settings


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


class Claim(NamedTuple):
    """What one claim statement did."""

    jobs: list[ClaimedJob]  # best first
    recorded: set[int]  # the successes recorded (fused statements), the others fenced out
    #: The statement was the wrong one for these queues now: a limit row applies (after a
    #: plain claim, which then claimed nothing) or none does (after a limited one).
    switch: bool
    #: A limited claim started all that some tenant's room allowed (sql._room_bound).
    room_bound: bool = False


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


@functools.lru_cache(maxsize=512)
def _statement(fused: bool, limited: bool, many: bool, limit: int, open_: bool = False) -> str:
    """The claim statement to run, its LIMITs written as ``limit`` (sql.claim_limit): one
    statement text per number of jobs asked for, each prepared once by the connection.
    ``open_``: the open claim (JOB_CLAIM_OPEN), whatever ``limited`` says."""
    if open_:
        statement = {
            (True, True): sql.JOB_COMPLETE_AND_CLAIM_OPEN_MANY_QUEUES,
            (True, False): sql.JOB_COMPLETE_AND_CLAIM_OPEN,
            (False, True): sql.JOB_CLAIM_OPEN_MANY_QUEUES,
            (False, False): sql.JOB_CLAIM_OPEN,
        }[fused, many]
    elif limited and many:
        statement = (
            sql.JOB_COMPLETE_AND_CLAIM_LIMITED_MANY_QUEUES
            if fused
            else sql.JOB_CLAIM_LIMITED_MANY_QUEUES
        )
    elif limited:
        statement = sql.JOB_COMPLETE_AND_CLAIM_LIMITED if fused else sql.JOB_CLAIM_LIMITED
    elif fused:
        statement = sql.JOB_COMPLETE_AND_CLAIM_MANY_QUEUES if many else sql.JOB_COMPLETE_AND_CLAIM
    else:
        statement = sql.JOB_CLAIM_MANY_QUEUES if many else sql.JOB_CLAIM
    return sql.claim_limit(statement, limit)


@functools.lru_cache(maxsize=512)
def _positional(statement: str) -> tuple[str, tuple[str, ...]]:
    """``statement`` with ``$1``, ``$2``... for its ``%(name)s`` parameters, and their names in
    that order: the form a ``psycopg.RawCursor`` runs as it is. psycopg parses a query's
    placeholders on every execute unless the query is under 4 KiB (its own cache); the
    limited claims are twice that, and parsing them cost the worker's loop about 0.2 ms
    per claim."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement).replace("%%", "%"), tuple(names)


def _execute(cursor: Any, statement: str, params: dict[str, Any]) -> list[Any]:
    """Run ``statement`` with ``params`` on ``cursor`` and return its rows; a
    ``psycopg.RawCursor`` (the worker's claims) gets the statement's positional form."""
    if isinstance(cursor, psycopg.RawCursor):
        text, names = _positional(statement)
        cursor.execute(text, [params[name] for name in names])
    else:
        cursor.execute(statement, params)
    return cursor.fetchall()


def claim_once(
    cursor: Any,
    *,
    worker: str,
    queues: Sequence[str],
    limit: int,
    limited: bool,
    results: Sequence[Sequence[Any]] = (),
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
    open_: bool = False,
) -> Claim:
    """One claim statement, plain or ``limited`` (or open, ``open_``: JOB_CLAIM_OPEN),
    recording ``results`` (successes) in it too when there are any: one round trip. The
    lease runs from ``now`` (default: the transaction's time), which tests inject."""
    params: dict[str, Any] = {
        "queues": list(queues),
        "limit": limit,
        "worker": worker,
        "lease": lease(lease_seconds),
        "now": now,
    }
    fused = bool(results)
    if fused:
        params.update(complete_params(results))
    rows = _execute(cursor, _statement(fused, limited, len(queues) > 1, limit, open_), params)
    jobs: list[ClaimedJob] = []
    recorded: set[int] = set()
    switch = room_bound = False
    for row in rows:
        if fused:
            if not row[0]:
                recorded.add(row[1])
                continue
            row = row[1:]
        if row[0] is None and row[1] == sql.ROOM_BOUND:
            room_bound = True
        elif row[0] is None:
            switch = True
        else:
            jobs.append(ClaimedJob(row[0], row[1], json.loads(row[2]), *row[3:13]))
    jobs.sort(key=lambda j: (-j.priority, j.vtime, j.id))
    return Claim(jobs, recorded, switch, room_bound)


def claim(
    cursor: Any,
    *,
    worker: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` runnable jobs, best first: the plain claim, then the limited
    one if a limit row applies (a second round trip only then)."""
    args = {"worker": worker, "queues": queues, "limit": limit}
    args.update(lease_seconds=lease_seconds, now=now)
    first = claim_once(cursor, limited=False, **args)
    return claim_once(cursor, limited=True, **args).jobs if first.switch else first.jobs


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
    """Record successes and claim up to ``limit`` jobs in one statement, both at ``now``;
    if a limit row applies, the limited claim follows in a statement of its own.

    Returns the ids recorded (the others were fenced out) and the claimed jobs.
    """
    args = {"worker": worker, "queues": queues, "limit": limit}
    args.update(lease_seconds=lease_seconds, now=now)
    first = claim_once(cursor, limited=False, results=results, **args)
    if not first.switch:
        return first.recorded, first.jobs
    return first.recorded, claim_once(cursor, limited=True, **args).jobs
