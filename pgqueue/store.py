"""Runs the named statements of ``pgqueue.sql`` and shapes their rows.

Every function takes an open DB-API cursor (Django's, or a bare psycopg one: the worker
uses its own connections) and does exactly one round trip unless its docstring says
otherwise. Transactions are the caller's business: in autocommit each call is its own.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import sql
from .claim_store import ClaimedJob, Success, claim, complete_and_claim, fail_params  # noqa: F401
from .claim_store import complete_params as _complete_params
from .claim_store import lease as _lease
from .conf import pgqueue_settings
from .exceptions import TooManyQueues
from .fairness import fifo_param, statement
from .tracing import TraceContext, bounded_tracestate, well_formed


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt to record; ``started`` and ``finished`` as in ``Success``."""

    id: int
    attempt: int
    error: str
    traceback: str | None = None
    permanent: bool = False
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    #: Seconds to the next attempt, the task's backoff (None: the global backoff).
    retry_in: float | None = None
    #: Seconds to snooze (pgqueue.Retry): scheduled again with the attempt given back.
    snooze: float | None = None


def _ids(rows: Iterable[Sequence[Any]]) -> list[int]:
    return [row[0] for row in rows]


class NewJob(NamedTuple):
    """What the enqueue statements return of each new job; all but the id only when the
    statement enqueued one job (see JOB_ENQUEUE in queries/enqueue.sql)."""

    id: int
    run_at: dt.datetime | None
    created_at: dt.datetime | None
    vtime: float | None


#: Most rounds of store.enqueue's statements. A round after the first happens only when a
#: statement met a concurrent change of the tenant's clocks: another first enqueue of the
#: tenant at the level ('known'), or a prune of idle clocks ('raced'); each round has a
#: snapshot that shows the change before it.
ENQUEUE_ROUNDS = 5


def enqueue(
    cursor: Any,
    *,
    task: str,
    tenant: str,
    queue: str,
    priority: int,
    max_attempts: int,
    payloads_json: str,
    count: int,
    idempotency_key: str | None = None,
    run_at: dt.datetime | None = None,
    timeout: float | None = None,
    max_queues: int | None = None,
    keys: Sequence[str | None] | None = None,
    key_max_running: int = 1,
    waiting: bool = False,
    workflow: int | None = None,
    steps: Sequence[str | None] | None = None,
    run_anyway: bool = False,
    trace: TraceContext | None = None,
) -> tuple[list[NewJob], bool]:
    """Insert ``count`` jobs whose payloads are the JSON array ``payloads_json``.

    Runnable at once when ``run_at`` is None (JOB_ENQUEUE), else scheduled
    (JOB_ENQUEUE_SCHEDULED). Returns the new jobs in payload order; none when the
    idempotency key was taken. ``charged`` tells whether the tenant's clock was moved for
    jobs that were not inserted (a racing duplicate key): the caller must refund it.

    One round trip when the tenant has a fair clock at the level (runnable) or in the
    queue (scheduled); otherwise a second one, JOB_ENQUEUE_FIRST (or _SCHEDULED_FIRST),
    which raises TooManyQueues, having written nothing, when the queue is new to the
    tenant and the tenant has clocks in ``max_queues`` queues already (None: no bound).
    ``keys``: each job's concurrency key (None: none has one), capped at
    ``key_max_running``; such a job waits for KEY_SETTLE to admit it.
    ``waiting``: the jobs wait for their dependencies (status 'waiting', run_at ``run_at``
    or now; pgqueue.workflows), in ``workflow`` under the names ``steps``, and run even
    when a dependency fails if ``run_anyway``. The caller inserts their dependencies.
    ``trace``: the W3C trace context the jobs record (``pgqueue.tracing``); a traceparent
    that is not well formed is not stored, nor then its tracestate.
    """
    traceparent = tracestate = None
    if trace is not None and well_formed(trace.traceparent):
        traceparent, tracestate = trace.traceparent, bounded_tracestate(trace.tracestate)

    params = {
        "task": task,
        "tenant": tenant,
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "payloads": payloads_json,
        "n": count,
        "idempotency_key": idempotency_key,
        "run_at": run_at,
        "timeout": timeout,
        "max_queues": max_queues,
        "keys": None if keys is None else list(keys),
        "key_max": key_max_running,
        "fifo": fifo_param(),
        "channel": pgqueue_settings.NOTIFY_CHANNEL,
        "status": "waiting" if waiting else "scheduled",
        "workflow": workflow,
        "steps": None if steps is None else list(steps),
        "run_anyway": run_anyway,
        "traceparent": traceparent,
        "tracestate": tracestate,
    }
    if run_at is None and not waiting:
        known = statement(sql.JOB_ENQUEUE, sql.JOB_ENQUEUE_BY_TIME, params)
        first = statement(sql.JOB_ENQUEUE_FIRST, sql.JOB_ENQUEUE_FIRST_BY_TIME, params)
    else:
        known, first = sql.JOB_ENQUEUE_SCHEDULED, sql.JOB_ENQUEUE_SCHEDULED_FIRST
    for _ in range(ENQUEUE_ROUNDS):
        rows, state = _enqueue_rows(cursor, known, params)
        # No clock of the tenant at the level (JOB_ENQUEUE: no row), or in the queue
        # (JOB_ENQUEUE_SCHEDULED: 'first'; no row there is a taken key).
        if state != "first" and (rows or state or run_at is not None or waiting):
            break
        rows, state = _enqueue_rows(cursor, first, params)
        if state not in ("known", "raced"):
            break
    else:
        raise RuntimeError(
            f"enqueue into {queue!r} met {ENQUEUE_ROUNDS} concurrent changes of its clocks"
        )
    if state == "refused":
        assert max_queues is not None
        raise TooManyQueues(tenant, queue, max_queues)
    jobs = [NewJob(row[0], row[1], row[2], row[3]) for row in rows if row[0] is not None]
    return jobs, len(rows) > len(jobs)


def _enqueue_rows(cursor: Any, text: str, params: dict[str, Any]) -> tuple[list[Any], str | None]:
    """Run an enqueue statement: its rows, or none and the state of its one row that says
    why nothing was enqueued (taken, first, known, raced, refused; see pgqueue.sql)."""
    cursor.execute(text, params)
    rows = cursor.fetchall()
    if len(rows) == 1 and rows[0][5] is not None:
        return [], rows[0][5]
    return rows, None


def refund_clock(
    cursor: Any, *, task: str, tenant: str, queue: str, priority: int, count: int
) -> None:
    params = {"task": task, "tenant": tenant, "queue": queue, "priority": priority, "n": count}
    cursor.execute(statement(sql.FAIR_CLOCK_REFUND, sql.FAIR_CLOCK_REFUND_BY_TIME, params), params)


def job_id_for_key(cursor: Any, *, tenant: str, idempotency_key: str) -> int | None:
    cursor.execute(
        sql.JOB_GET_ID_BY_IDEMPOTENCY_KEY, {"tenant": tenant, "idempotency_key": idempotency_key}
    )
    row = cursor.fetchone()
    return None if row is None else row[0]


def complete_many(
    cursor: Any,
    *,
    worker: str,
    results: Sequence[Sequence[Any]],
    now: dt.datetime | None = None,
    awaited: set[int] | None = None,
) -> set[int]:
    """Record successes: a ``Success``, or ``(job id, attempt, result as JSON text or
    None)``, each.

    Returns the ids recorded; the others had lost their lease (fenced out). Adds to
    ``awaited`` those a job waits for: their dependents are to be settled after the commit
    (``workflow_store.settle_after``).
    """
    params = {"worker": worker, "now": now, **_complete_params(results)}
    cursor.execute(sql.JOB_COMPLETE_MANY, params)
    rows = cursor.fetchall()
    if awaited is not None:
        awaited.update(row[0] for row in rows if row[1])
    return set(_ids(rows))


def fail_many(
    cursor: Any, *, worker: str, failures: Sequence[Failure], now: dt.datetime | None = None
) -> dict[int, str]:
    """Record failures (and snoozes), backoffs counted from ``now``.

    Returns ``{job id: new status}`` for those not fenced out: 'scheduled', 'dead', or
    'snoozed' for a job a snooze scheduled.
    """
    cursor.execute(sql.JOB_FAIL_MANY, {"worker": worker, "now": now, **fail_params(failures)})
    return {row[0]: row[1] for row in cursor.fetchall()}


def heartbeat_flags(
    cursor: Any,
    *,
    worker: str,
    held: Sequence[tuple[int, int]],
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
    started: Mapping[int, dt.datetime] | None = None,
    progress: Mapping[int, str | None] | None = None,
    output: Mapping[int, str | None] | None = None,
) -> dict[int, bool]:
    """Extend the leases of ``(job id, attempt)`` pairs to ``now`` + the lease
    (JOB_HEARTBEAT_MANY): ``{job id still held: whether its cancellation was requested}``.
    ``started`` gives the jobs whose handler has begun their start (written once);
    ``progress`` and ``output`` the JSON text of what their handlers reported since the
    last round (a job not named, or None: unchanged).
    """
    started = started or {}
    progress = progress or {}
    output = output or {}
    cursor.execute(
        sql.JOB_HEARTBEAT_MANY,
        {
            "worker": worker,
            "ids": [h[0] for h in held],
            "attempts": [h[1] for h in held],
            "started": [started.get(h[0]) for h in held],
            "progress": [progress.get(h[0]) for h in held],
            "output": [output.get(h[0]) for h in held],
            "lease": _lease(lease_seconds),
            "now": now,
        },
    )
    return {row[0]: bool(row[1]) for row in cursor.fetchall()}


def heartbeat_many(
    cursor: Any,
    *,
    worker: str,
    held: Sequence[tuple[int, int]],
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
) -> set[int]:
    """``heartbeat_flags``, the ids still held only."""
    return set(
        heartbeat_flags(cursor, worker=worker, held=held, lease_seconds=lease_seconds, now=now)
    )


def reap_expired(
    cursor: Any, *, limit: int | None = None, now: dt.datetime | None = None
) -> dict[int, str]:
    """Recover expired leases (JOB_REAP_EXPIRED). Returns ``{job id: new status}``:
    'scheduled' or 'dead' for a job whose start was recorded (an attempt spent), 'queued'
    for one given back without (or 'dead' at its MAX_LOST_CLAIMS-th such loss)."""
    cursor.execute(
        sql.JOB_REAP_EXPIRED,
        {
            "limit": limit or pgqueue_settings.MAINTENANCE_BATCH_SIZE,
            "now": now,
            "backoff_base": float(pgqueue_settings.BACKOFF_BASE),
            "backoff_cap": float(pgqueue_settings.BACKOFF_CAP),
            "max_lost_claims": int(pgqueue_settings.MAX_LOST_CLAIMS),
            "channel": pgqueue_settings.NOTIFY_CHANNEL,
        },
    )
    return {row[0]: row[1] for row in cursor.fetchall()}


def promote_due(
    cursor: Any, *, limit: int | None = None, now: dt.datetime | None = None
) -> list[int]:
    """Make due scheduled jobs runnable with fresh vtimes: two round trips,
    FAIR_CLOCK_ENSURE_DUE then JOB_PROMOTE_DUE, in the caller's transaction."""
    limit = limit or pgqueue_settings.MAINTENANCE_BATCH_SIZE
    cursor.execute(sql.FAIR_CLOCK_ENSURE_DUE, {"limit": limit, "now": now})
    params = {
        "limit": limit,
        "now": now,
        "fifo": fifo_param(),
        "channel": pgqueue_settings.NOTIFY_CHANNEL,
    }
    cursor.execute(statement(sql.JOB_PROMOTE_DUE, sql.JOB_PROMOTE_DUE_BY_TIME, params), params)
    return _ids(cursor.fetchall())


def promote_ids(cursor: Any, ids: Sequence[int]) -> list[int]:
    """Make the named scheduled jobs runnable now: two round trips,
    FAIR_CLOCK_ENSURE_MANY then JOB_PROMOTE_MANY, in the caller's transaction."""
    cursor.execute(sql.FAIR_CLOCK_ENSURE_MANY, {"ids": list(ids)})
    params = {
        "ids": list(ids),
        "limit": len(ids),
        "fifo": fifo_param(),
        "channel": pgqueue_settings.NOTIFY_CHANNEL,
    }
    cursor.execute(statement(sql.JOB_PROMOTE_MANY, sql.JOB_PROMOTE_MANY_BY_TIME, params), params)
    return _ids(cursor.fetchall())


def _update_ids(cursor: Any, statement: str, ids: Sequence[int]) -> list[int]:
    cursor.execute(statement, {"ids": list(ids)})
    return _ids(cursor.fetchall())


def cancel_many(cursor: Any, ids: Sequence[int]) -> list[int]:
    return _update_ids(cursor, sql.JOB_CANCEL_MANY, ids)


def retry_many(cursor: Any, ids: Sequence[int]) -> list[tuple[int, bool]]:
    """Send dead or cancelled jobs back (JOB_RETRY_MANY): ``(id, due now)`` of each."""
    cursor.execute(sql.JOB_RETRY_MANY, {"ids": list(ids)})
    return [(row[0], row[1]) for row in cursor.fetchall()]


def run_now_many(cursor: Any, ids: Sequence[int]) -> list[int]:
    return _update_ids(cursor, sql.JOB_MAKE_DUE_MANY, ids)


def queue_admitted(cursor: Any, *, tenant: str, queue: str, max_queues: int | None) -> bool:
    """Whether a job of ``tenant`` may become live in ``queue`` under ``max_queues``
    (TENANT_QUEUE_ADMITTED)."""
    cursor.execute(
        sql.TENANT_QUEUE_ADMITTED, {"tenant": tenant, "queue": queue, "max_queues": max_queues}
    )
    return bool(cursor.fetchone()[0])


def statuses(cursor: Any, ids: Sequence[int]) -> dict[int, str]:
    cursor.execute(sql.JOB_GET_STATUS_MANY, {"ids": list(ids)})
    return {row[0]: row[1] for row in cursor.fetchall()}


def set_weight(cursor: Any, *, tenant: str, weight: float, queue: str | None = None) -> None:
    params = {"tenant": tenant, "weight": float(weight), "queue": queue}
    cursor.execute(sql.TENANT_WEIGHT_SET if queue is None else sql.QUEUE_WEIGHT_SET, params)


def release_many(cursor: Any, *, worker: str, held: Sequence[tuple[int, int]]) -> set[int]:
    """Give back claimed-but-unstarted ``(job id, attempt)`` pairs (JOB_RELEASE_MANY)."""
    cursor.execute(
        sql.JOB_RELEASE_MANY,
        {
            "worker": worker,
            "ids": [h[0] for h in held],
            "attempts": [h[1] for h in held],
            "channel": pgqueue_settings.NOTIFY_CHANNEL,
        },
    )
    return set(_ids(cursor.fetchall()))


def give_back_many(
    cursor: Any, *, worker: str, held: Sequence[tuple[int, int]], delay: float
) -> set[int]:
    """Give back claimed ``(job id, attempt)`` pairs the worker cannot run, the attempt not
    counted, runnable again in ``delay`` seconds (JOB_GIVE_BACK_MANY)."""
    cursor.execute(
        sql.JOB_GIVE_BACK_MANY,
        {
            "worker": worker,
            "ids": [h[0] for h in held],
            "attempts": [h[1] for h in held],
            "delay": float(delay),
            "now": None,
            "channel": pgqueue_settings.NOTIFY_CHANNEL,
        },
    )
    return set(_ids(cursor.fetchall()))


#: The advisory lock key of maintenance ("pgqueue" in ASCII, as a bigint).
MAINTENANCE_LOCK_KEY = int.from_bytes(b"pgqueue", "big")


def try_maintenance_lock(cursor: Any) -> bool:
    cursor.execute(sql.MAINTENANCE_TRY_LOCK, {"key": MAINTENANCE_LOCK_KEY})
    return bool(cursor.fetchone()[0])


#: Most task names a worker records in its registry row (``Worker.tasks``); a worker
#: serving more records none (NULL: "not recorded", read as serving every task).
WORKER_TASKS_MAX = 1000


def register_worker(
    cursor: Any,
    *,
    worker: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    tasks: Sequence[str] | None = None,
) -> None:
    """Record the worker (WORKER_REGISTER); ``tasks`` None, or more than
    ``WORKER_TASKS_MAX`` of them, is recorded as NULL: not known."""
    recorded = None if tasks is None or len(tasks) > WORKER_TASKS_MAX else list(tasks)
    cursor.execute(
        sql.WORKER_REGISTER,
        {
            "worker": worker,
            "host": host,
            "pid": pid,
            "queues": json.dumps(list(queues)),
            "tasks": None if recorded is None else json.dumps(recorded),
            "concurrency": concurrency,
        },
    )


def database_clock(cursor: Any) -> dt.datetime:
    """The database server's clock now (DATABASE_CLOCK_READ)."""
    cursor.execute(sql.DATABASE_CLOCK_READ)
    return cursor.fetchone()[0]


def stop_worker(cursor: Any, *, worker: str) -> None:
    cursor.execute(sql.WORKER_STOP, {"worker": worker})


def prune_workers(cursor: Any) -> None:
    cursor.execute(sql.WORKER_PRUNE)


def attempt_head(cursor: Any) -> int:
    """The largest attempt id committed so far (TASK_STAT_HEAD), before any write of the
    transaction: it draws the transaction's xid, which must come after the read."""
    cursor.execute(sql.TASK_STAT_HEAD)
    return int(cursor.fetchone()[0])


def fold_task_stats(cursor: Any, *, head: int | None = None, limit: int = 10_000) -> int:
    """Fold attempts into the per-task totals (TASK_STAT_FOLD); returns how many.

    ``head`` is ``attempt_head`` read before this transaction's first write; None reads
    it now, which is sound only in a transaction that has written nothing yet.
    """
    from .models import RUN_TIME_BUCKETS

    if head is None:
        head = attempt_head(cursor)
    cursor.execute(
        sql.TASK_STAT_FOLD,
        {"head": head, "limit": limit, "buckets": list(RUN_TIME_BUCKETS)},
    )
    row = cursor.fetchone()
    if not row or not row[0]:
        return 0
    # The same attempts, by queue and tenant, in the same transaction: folded once, together.
    fold_tenant_stats(cursor, after=int(row[1]), upto=int(row[2]))
    return int(row[0])


def fold_tenant_stats(cursor: Any, *, after: int, upto: int) -> None:
    """Fold the attempts with ids in (after, upto] into the per-tenant wait and run-time
    totals (TENANT_STAT_FOLD); only ``fold_task_stats`` calls it, with the range it folded."""
    from .models import RUN_TIME_BUCKETS

    cursor.execute(
        sql.TENANT_STAT_FOLD,
        {
            "after": after,
            "upto": upto,
            "series": int(pgqueue_settings.METRICS_TENANT_SERIES),
            "buckets": list(RUN_TIME_BUCKETS),
        },
    )


def release_idle_tenant_stats(cursor: Any) -> None:
    """Free the per-tenant series places of tenants idle for METRICS_TENANT_IDLE_SECONDS
    (TENANT_STAT_RELEASE_IDLE)."""
    cursor.execute(
        sql.TENANT_STAT_RELEASE_IDLE,
        {"idle": float(pgqueue_settings.METRICS_TENANT_IDLE_SECONDS)},
    )
