"""The read side: every figure the HTTP API, the admin, the dashboard and /metrics show.

Each figure is computed here once, so two pages never disagree on what "backlog" or "alive"
means. Plain ORM reads are written here; raw SQL lives in ``pgqueue.read_sql``, whose
docstring lists what each read costs. These are summaries for people and scrapers, not hot
paths: nothing here locks a row. The write side is ``pgqueue.sql`` + ``pgqueue.store``.

The read side's other two rooms: ``pgqueue.liveness`` (which workers are alive, and what no
live worker serves) and ``pgqueue.pages`` (bounded pages and lists of jobs and schedules).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import connections, transaction
from django.db.models import (
    Avg,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import TruncMinute
from django.utils import timezone

from . import read_sql
from .conf import pgqueue_settings, queue_db
from .liveness import workers_alive
from .models import (
    LIVE_STATUSES,
    Job,
    JobAttempt,
    Outcome,
    QueueWeight,
    Status,
    Tenant,
    TenantStat,
)

#: The jobs waiting to run: runnable now, or later (delayed, backing off).
BACKLOG_STATUSES = (Status.QUEUED, Status.SCHEDULED)
#: The statuses a job ends in: their rows grow with the history, so they are counted up to
#: COUNT_CAP only.
FINISHED_STATUSES = (Status.DONE, Status.DEAD, Status.CANCELLED)
#: Attempts that did not succeed: the handler failed, or its worker stopped renewing the lease.
FAILED_OUTCOMES = (Outcome.FAILED, Outcome.LEASE_EXPIRED)
#: The window of /stats' throughput, error rate and mean run time.
STATS_WINDOW = dt.timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One minute of the throughput chart: attempts that finished within it."""

    minute: dt.datetime  # the start of the minute, in UTC
    done: int
    failed: int  # failed + lease_expired


# -- jobs --------------------------------------------------------------------------------


class BoundedCount(int):
    """A count that stopped at its bound: the rows counted (bound + 1), a true lower bound.

    Compares and sums as a number (a sum with one is bounded too) and reads as "N+", N being
    the bound: "1000+" is "more than 1000". The admin's lists and the dashboard show it so.
    """

    def __str__(self) -> str:
        return f"{int(self) - 1}+"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else int.__format__(int(self) - 1, spec) + "+"

    def __add__(self, other: Any) -> Any:
        return BoundedCount(int(self) + int(other)) if isinstance(other, int) else NotImplemented

    __radd__ = __add__


def bounded(counted: int, bound: int) -> int:
    """``counted`` rows of a count stopped after ``bound + 1``: a BoundedCount past ``bound``."""
    return BoundedCount(counted) if counted > bound else counted


def count_cap() -> int:
    """How far counts that grow with the history are taken (``PGQUEUE["COUNT_CAP"]``)."""
    return int(pgqueue_settings.COUNT_CAP)


@contextmanager
def _stopping_scans(using: str | None) -> Iterator[Any]:
    """A cursor whose plans stop where a LIMIT says (BOUNDED_COUNT_PLANS).

    A count "up to the cap" is bounded only if it reads an index in order and stops: a
    bitmap scan collects every matching entry first, and a sequential scan the planner
    picks for a common value can run past the end of a rare one. The planner's estimates
    cannot tell a tenant or queue with no finished job from an average one, so for these
    statements it is not asked to choose: both are turned off for one transaction.
    """
    # No savepoint: a read inside the caller's transaction needs none, and the page's query
    # count stays that of its statements.
    with (
        transaction.atomic(using=queue_db(using), savepoint=False),
        connections[queue_db(using)].cursor() as cursor,
    ):
        cursor.execute(read_sql.BOUNDED_COUNT_PLANS)
        yield cursor


def job_counts(*, using: str | None = None) -> dict[str, dict[str, int]]:
    """Jobs by queue and status, ``{queue: {status: n}}``: only the pairs that have jobs.

    One statement, JOB_COUNTS_BOUNDED: live statuses exact (the partial indexes, live rows
    only), finished ones counted up to COUNT_CAP and a BoundedCount past it. Nothing here
    reads every job: a year of history costs what a day does.
    """
    cap = count_cap()
    queues: dict[str, dict[str, int]] = defaultdict(dict)
    with _stopping_scans(using) as cursor:
        cursor.execute(read_sql.JOB_COUNTS_BOUNDED, {"bound": cap + 1})
        rows = cursor.fetchall()
    for queue, status, n in rows:
        if n:
            queues[queue][status] = bounded(n, cap) if status in FINISHED_STATUSES else n
    return dict(queues)


def capped(counts: dict[str, int]) -> list[str]:
    """The keys of ``counts`` whose figure stopped at the bound, in order."""
    return sorted(k for k, n in counts.items() if isinstance(n, BoundedCount))


def oldest_runnable(*, using: str | None = None) -> dict[str, dt.datetime]:
    """When the oldest queued job of each queue became runnable (its ``run_at``).

    The queued rows only, which the partial indexes pgqueue_job_claim and pgqueue_job_gated
    cover: bounded by the runnable backlog, not by the history.
    """
    rows = (
        Job.objects.using(queue_db(using))
        # One arm per partial index (pgqueue_job_claim: not gated; pgqueue_job_gated; the
        # jobs waiting for their concurrency key: pgqueue_job_key_new, _waiting): a bare
        # status filter matches neither and reads an index of every job.
        .filter(
            Q(status=Status.QUEUED, gated=False)
            | Q(status=Status.QUEUED, gated=True)
            | Q(status=Status.QUEUED, key_state="new")
            | Q(status=Status.QUEUED, key_state="waiting")
        )
        .values("queue")
        .annotate(oldest=Min("run_at"))
        .values_list("queue", "oldest")
        .order_by()
    )
    return dict(rows)


def key_counts(*, using: str | None = None) -> tuple[int, int, int]:
    """Concurrency keys in use: (keys with a slot held, slots held, queued jobs waiting for
    their key), by KEY_COUNTS: live rows only."""
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.KEY_COUNTS)
        keys, slots, waiting = cursor.fetchone()
    return int(keys), int(slots), int(waiting)


def live_workflows(*, using: str | None = None) -> int:
    """How many workflows have an unfinished job.

    Its filter is the predicate of the partial index pgqueue_job_workflow_live (live jobs
    of a workflow only), so the DISTINCT reads that index's entries, one per live job,
    whatever the number of finished workflows and jobs kept.
    """
    return (
        Job.objects.using(queue_db(using))
        .filter(workflow__isnull=False, status__in=LIVE_STATUSES)
        .order_by()
        .values("workflow_id")
        .distinct()
        .count()
    )


def row_estimate(table: str, *, using: str | None = None) -> int | None:
    """The planner's estimate of a table's rows (TABLE_ROW_ESTIMATE): no scan at all."""
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.TABLE_ROW_ESTIMATE, {"table": table})
        row = cursor.fetchone()
    return int(row[0]) if row else None


# -- tenants -----------------------------------------------------------------------------


def tenant_counts(tenants: QuerySet[Tenant]) -> QuerySet[Tenant]:
    """``tenants`` with each one's job counts: ``n_backlog`` (queued + scheduled),
    ``n_running``, ``n_done`` and ``n_dead``. A queryset, so the admin can sort on them.

    Correlated counts through pgqueue_job_tenant_status (TENANT_JOBS_BACKLOG,
    TENANT_JOBS_RUNNING, TENANT_JOBS_IN_STATUS): the live ones exact, done and dead up to
    COUNT_CAP + 1 rows (``bounded`` turns a figure past the cap into a BoundedCount).
    """
    stop = count_cap() + 1
    return tenants.annotate(
        n_backlog=RawSQL(read_sql.TENANT_JOBS_BACKLOG, ()),
        n_running=RawSQL(read_sql.TENANT_JOBS_RUNNING, ()),
        n_done=RawSQL(read_sql.TENANT_JOBS_IN_STATUS, (Status.DONE.value, stop)),
        n_dead=RawSQL(read_sql.TENANT_JOBS_IN_STATUS, (Status.DEAD.value, stop)),
    )


def tenant_done_share(tenants: QuerySet[Tenant], since: dt.datetime) -> QuerySet[Tenant]:
    """``tenants`` with ``n_hour``, the jobs each had done since ``since``, and
    ``n_hour_total``, those of all tenants: the share fair scheduling gave each.

    The window's attempts through pgqueue_attempt_finished, joined to their jobs by key.
    """
    done = JobAttempt.objects.using(queue_db()).filter(finished_at__gte=since, outcome=Outcome.DONE)
    per_tenant = (
        done.filter(job__tenant_id=OuterRef("name"))
        .order_by()
        .values("job__tenant_id")
        .annotate(n=Count("id"))
        .values("n")
    )
    total = done.order_by().values("outcome").annotate(n=Count("id")).values("n")
    return tenants.annotate(n_hour=Subquery(per_tenant), n_hour_total=Subquery(total))


def tenant_page(
    names: Iterable[str] | None = None,
    *,
    offset: int = 0,
    limit: int = 50,
    using: str | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    """How many tenants there are (all, or those named), and the summaries of ``limit`` of
    them from ``offset``, by name: GET /tenants' page.

    The count reads pgqueue_tenant (a small table); the counts of jobs only the page's
    tenants' (tenant_summaries), so a page costs the same whatever the number of tenants.
    """
    tenants = Tenant.objects.using(queue_db(using))
    if names is not None:
        tenants = tenants.filter(name__in=list(names))
    page = tenants.order_by("name").values_list("name", flat=True)[offset : offset + limit]
    return tenants.count(), tenant_summaries(list(page), using=using)


def tenant_summaries(
    names: Iterable[str] | None = None, *, using: str | None = None
) -> list[dict[str, Any]]:
    """Weight, per-queue weights and job counts of tenants (all, or those named), by name.

    ``done`` and ``dead`` stop at COUNT_CAP (a BoundedCount past it, named in ``capped``).
    """
    tenants = Tenant.objects.using(queue_db(using)).order_by("name")
    if names is not None:
        tenants = tenants.filter(name__in=list(names))
    with _stopping_scans(using):
        tenants = list(tenant_counts(tenants))
    overrides: dict[str, dict[str, float]] = defaultdict(dict)
    wanted = [t.name for t in tenants]
    for qw in QueueWeight.objects.using(queue_db(using)).filter(tenant_id__in=wanted):
        overrides[qw.tenant_id][qw.queue] = qw.weight
    cap = count_cap()
    from .limit_reads import tenant_limits

    limits = tenant_limits(wanted, using=using)
    summaries = []
    for t in tenants:
        counts = {"done": bounded(t.n_done, cap), "dead": bounded(t.n_dead, cap)}
        summaries.append(
            {
                "name": t.name,
                "weight": t.weight,
                "queue_weights": overrides[t.name],
                "backlog": t.n_backlog,
                "running": t.n_running,
                **counts,
                "capped": capped(counts),
                "created_at": t.created_at,
                **limits[t.name],
            }
        )
    return summaries


def top_backlogs(limit: int, *, using: str | None = None) -> list[tuple[str, int, int, int]]:
    """The ``limit`` tenants with the largest backlog, largest first (TENANT_BACKLOG_TOP):
    ``(tenant, queued, scheduled, backlog)`` each."""
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.TENANT_BACKLOG_TOP, {"limit": limit})
        return [tuple(row) for row in cursor.fetchall()]


def top_backlogs_with_share(
    since: dt.datetime, until: dt.datetime, limit: int, *, using: str | None = None
) -> tuple[list[dict[str, Any]], int]:
    """The ``limit`` tenants with the largest backlog, with their weights and the jobs each
    had done in the window, and the jobs all tenants had done in it, in one statement
    (TENANT_BACKLOG_TOP_WITH_SHARE). The total is 0 when no tenant has a backlog."""
    params = {"limit": limit, "since": since, "until": until}
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.TENANT_BACKLOG_TOP_WITH_SHARE, params)
        rows = cursor.fetchall()
    done_total = int(rows[0][8]) if rows else 0
    tenants = [
        {
            "name": name,
            "queued": queued,
            "scheduled": scheduled,
            "backlog": backlog,
            # A job's tenant row is created with it; a missing one would weigh the default.
            "weight": weight if weight is not None else 1.0,
            "queue_weights": dict(zip(qw_queues, qw_weights, strict=True)),
            "done_last_hour": done,
        }
        for name, queued, scheduled, backlog, weight, qw_queues, qw_weights, done, _ in rows
    ]
    return tenants, done_total


# -- attempts ----------------------------------------------------------------------------


def recent_attempts(since: dt.datetime, *, using: str | None = None) -> dict[str, Any]:
    """Attempts finished since ``since``: ``done``, ``errors`` (failed + lease expired) and
    ``run``, the mean run time of the done ones (a timedelta, or None).

    The window's rows of pgqueue_job_attempt through pgqueue_attempt_finished.
    """
    return (
        JobAttempt.objects.using(queue_db(using))
        .filter(finished_at__gte=since)
        .aggregate(
            done=Count("id", filter=Q(outcome=Outcome.DONE)),
            errors=Count("id", filter=Q(outcome__in=FAILED_OUTCOMES)),
            run=Avg(F("finished_at") - F("started_at"), filter=Q(outcome=Outcome.DONE)),
        )
    )


def throughput_buckets(
    since: dt.datetime, minutes: int, *, using: str | None = None
) -> list[Bucket]:
    """Done and failed (failed + lease_expired) attempts per minute for the ``minutes``
    minutes from ``since``, zeros included, oldest first.

    The window's rows of pgqueue_job_attempt through pgqueue_attempt_finished, grouped by
    date_trunc('minute', finished_at): at most ``minutes`` rows come back.
    """
    until = since + dt.timedelta(minutes=minutes)
    rows = (
        JobAttempt.objects.using(queue_db(using))
        .filter(finished_at__gte=since, finished_at__lt=until)
        .annotate(minute=TruncMinute("finished_at", tzinfo=dt.UTC))
        .values("minute")
        .annotate(
            done=Count("id", filter=Q(outcome=Outcome.DONE)),
            failed=Count("id", filter=Q(outcome__in=FAILED_OUTCOMES)),
        )
        .values_list("minute", "done", "failed")
        .order_by("minute")
    )
    found = {minute.astimezone(dt.UTC): (done, failed) for minute, done, failed in rows}
    buckets = []
    for i in range(minutes):
        minute = since + dt.timedelta(minutes=i)
        done, failed = found.get(minute, (0, 0))
        buckets.append(Bucket(minute, done, failed))
    return buckets


def slowest_tasks(
    since: dt.datetime, until: dt.datetime, limit: int, *, using: str | None = None
) -> list[tuple[str, int, float, float]]:
    """The ``limit`` task names with the longest mean run time (finished_at - started_at)
    over the window's done attempts: ``(task, count, mean_seconds, max_seconds)`` each.

    The window's done attempts through pgqueue_attempt_finished, each joined to its job by
    primary key for the task name.
    """
    run = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    rows = (
        JobAttempt.objects.using(queue_db(using))
        .filter(
            outcome=Outcome.DONE,
            finished_at__gte=since,
            finished_at__lt=until,
            started_at__isnull=False,
        )
        .values("job__task")
        .annotate(n=Count("id"), mean=Avg(run), longest=Max(run))
        .values_list("job__task", "n", "mean", "longest")
        .order_by("-mean", "job__task")[:limit]
    )
    return [
        (task, n, mean.total_seconds(), longest.total_seconds()) for task, n, mean, longest in rows
    ]


class TenantWait(NamedTuple):
    """One row of the dashboard's wait-by-tenant table (seconds; ``tenant`` None: the
    tenants past the top ones, together)."""

    tenant: str | None
    attempts: int
    wait_p50: float
    wait_p95: float
    wait_max: float
    run_p95: float


def tenant_waits(
    since: dt.datetime, until: dt.datetime, limit: int, *, using: str | None = None
) -> list[TenantWait]:
    """How long each of the ``limit`` busiest tenants waited for its jobs to start (from
    runnable to the handler's start) and how long they ran, over the attempts that finished
    in the window, and the other tenants together last (TENANT_WAIT_TOP)."""
    params = {"since": since, "until": until, "limit": limit}
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.TENANT_WAIT_TOP, params)
        return [TenantWait(*row) for row in cursor.fetchall()]


def tenant_stats(*, using: str | None = None) -> list[tuple[str, str, str, float, int, float]]:
    """The per-tenant wait and run-time totals maintenance folds (pgqueue_tenant_stat):
    ``(queue, tenant, kind, le, count, seconds)``, tenant "" for "other"; at most
    (METRICS_TENANT_SERIES + 1) x 2 x buckets rows a queue."""
    return list(
        TenantStat.objects.using(queue_db(using))
        .order_by("queue", "tenant", "kind", "le")
        .values_list("queue", "tenant", "kind", "le", "count", "seconds")
    )


# -- /stats ------------------------------------------------------------------------------


def stats(*, using: str | None = None) -> dict[str, Any]:
    """Counts by queue and status, and the last minute's throughput, errors and run time.

    The finished counts stop at COUNT_CAP: ``capped`` names, per queue, the statuses whose
    figure is a lower bound (the rows counted, COUNT_CAP + 1), and ``dead_capped`` says the
    same of the total.
    """
    queues = job_counts(using=using)
    recent = recent_attempts(timezone.now() - STATS_WINDOW, using=using)
    finished = recent["done"] + recent["errors"]
    run = recent["run"]
    dead = sum((s.get(Status.DEAD, 0) for s in queues.values()), 0)
    return {
        "queues": {q: {k: int(n) for k, n in sorted(s.items())} for q, s in sorted(queues.items())},
        "capped": {q: capped(s) for q, s in sorted(queues.items()) if capped(s)},
        "count_cap": count_cap(),
        "throughput_per_s_60s": round(recent["done"] / STATS_WINDOW.total_seconds(), 3),
        "error_rate_60s": round(recent["errors"] / finished, 4) if finished else 0.0,
        "mean_run_seconds_60s": round(run.total_seconds(), 6) if run is not None else None,
        "workers_alive": workers_alive(using=using),
        "dead": int(dead),
        "dead_capped": isinstance(dead, BoundedCount),
    }
