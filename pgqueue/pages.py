"""Pages of jobs for people: GET /jobs's keyset pages and bounded counts, the command line's
job lists and histories, and the list of periodic schedules.

Part of the read side (``pgqueue.reads`` holds the figures); each read here is bounded by the
page it returns, never by the number of jobs.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.db import connections
from django.db.models import (
    BooleanField,
    Case,
    ExpressionWrapper,
    F,
    Func,
    Q,
    QuerySet,
    TextField,
    When,
)
from django.db.models.functions import Cast

from . import read_sql
from .conf import pgqueue_settings, queue_db
from .models import (
    Job,
    JobAttempt,
    PeriodicSchedule,
)
from .reads import count_cap, row_estimate

# -- the command line --------------------------------------------------------------------


def job_list(
    *,
    status: str | None = None,
    queue: str | None = None,
    tenant: str | None = None,
    task: str | None = None,
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
    limit: int = 50,
    using: str | None = None,
) -> tuple[list[Job], bool, bool]:
    """Up to ``limit`` jobs matching GET /jobs' filters, newest (highest id) first, whether
    more match among those examined, and whether older jobs were left unexamined:
    ``manage.py pgqueue jobs``.

    The same window as GET /jobs' first page (``window_edge``): the newest LIST_WINDOW jobs
    (of ``tenant``, when named), filtered. No count: counting the matches of a filter like
    ``status=done`` reads every finished row. One row past the limit says whether more
    exist instead.
    """
    in_reach = Job.objects.using(queue_db(using)).all()
    if tenant is not None:
        in_reach = in_reach.filter(tenant_id=tenant)
    jobs = in_reach
    if status is not None:
        jobs = jobs.filter(status=status)
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    if task is not None:
        jobs = jobs.filter(task=task)
    if created_after is not None:
        jobs = jobs.filter(created_at__gte=created_after)
    if created_before is not None:
        jobs = jobs.filter(created_at__lte=created_before)
    edge = window_edge(in_reach, key=None, backward=False)
    if edge is not None:
        jobs = jobs.filter(id__gte=edge)
    rows = list(jobs.order_by("-id")[: limit + 1])
    return rows[:limit], len(rows) > limit, edge is not None


def job_history(
    job_id: int, limit: int, *, using: str | None = None
) -> tuple[int, list[JobAttempt]]:
    """How many attempts a job has recorded, and the last ``limit`` of them, oldest first:
    ``manage.py pgqueue show``.

    That job's rows of pgqueue_job_attempt through the index on its job_id: bounded by one
    job's attempts (max_attempts per run, times the retries an operator made).
    """
    attempts = JobAttempt.objects.using(queue_db(using)).filter(job_id=job_id)
    last = list(attempts.order_by("-id")[:limit])
    return attempts.count(), last[::-1]


# -- periodic schedules --------------------------------------------------------------------


def periodic_schedules(shown: int, *, using: str | None = None) -> list[dict[str, Any]]:
    """The first ``shown`` periodic schedules by name, removed ones last, as the admin lists
    them. pgqueue_periodic holds one row per schedule a deploy declared or an operator
    created (tens, not jobs). ``every`` is a timedelta (None for a cron schedule)."""
    rows = (
        PeriodicSchedule.objects.using(queue_db(using))
        .order_by(F("removed_at").asc(nulls_first=True), "name")
        .values(
            "name", "cron", "every", "timezone", "task", "tenant", "queue", "enabled", "missed",
            "source", "next_run_at", "last_run_at", "last_job_id", "removed_at",
        )[:shown]
    )  # fmt: skip
    return list(rows)


# -- GET /jobs ---------------------------------------------------------------------------


def list_window() -> int:
    """How many jobs in reach one page of GET /jobs examines (``PGQUEUE["LIST_WINDOW"]``)."""
    return int(pgqueue_settings.LIST_WINDOW)


def window_edge(in_reach: QuerySet[Job], *, key: int | None, backward: bool) -> int | None:
    """The id that closes a page's window: the LIST_WINDOW-th job of ``in_reach`` past the
    cursor (older than ``key``, from the newest without one; newer than ``key`` with
    ``backward``), or None when no job of ``in_reach`` lies past it: the window then runs
    to the end.

    ``in_reach`` is every job, or one tenant's: the ids alone, from the primary key or from
    pgqueue_job_tenant_id (tenant, id), an index-only scan of LIST_WINDOW + 1 entries whatever
    the history. The page and its count then read only ids between the cursor and this
    edge, so a filter that matches little (a rare task, an unknown queue, an old date)
    costs a window, not a walk of every job.
    """
    window = list_window()
    if backward:
        assert key is not None
        ids = in_reach.filter(id__gt=key).order_by("id")
    else:
        ids = (in_reach if key is None else in_reach.filter(id__lt=key)).order_by("-id")
    # The window's last id and the one past it: without a job past the window, the window
    # already runs to the end.
    found = list(ids.values_list("id", flat=True)[window - 1 : window + 1])
    return found[0] if len(found) == 2 else None


def bounded_count(jobs: QuerySet[Job], edge: int | None) -> tuple[int, bool]:
    """How many jobs ``jobs`` holds, and whether that is an estimate.

    ``edge`` is the first page's (``window_edge`` from the newest): the matches among the
    newest LIST_WINDOW jobs in reach are counted, up to COUNT_CAP + 1 (a LIMITed subquery in
    id order). Exact when that window held every job in reach and the count stayed within
    the cap; otherwise the planner's estimate (TABLE_ROW_ESTIMATE unfiltered,
    QUERY_PLAN_ROWS filtered: no row read), never less than the rows counted.
    """
    cap = count_cap()
    window = jobs if edge is None else jobs.filter(id__gte=edge)
    counted = window.order_by("-id")[: cap + 1].count()
    if edge is None and counted <= cap:
        return counted, False
    if not jobs.query.where:
        estimate = row_estimate(Job._meta.db_table, using=jobs.db) or 0
    else:
        estimate = estimate_rows(jobs)
    return max(counted, estimate), True


def estimate_rows(jobs: QuerySet[Any]) -> int:
    """The planner's estimate of the rows ``jobs`` returns (QUERY_PLAN_ROWS): no row read."""
    sql, params = jobs.order_by().query.sql_with_params()
    with connections[jobs.db].cursor() as cursor:
        cursor.execute(read_sql.QUERY_PLAN_ROWS + sql, params)
        (plan,) = cursor.fetchone()
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def job_list_page(
    jobs: QuerySet[Job],
    *,
    key: int | None,
    backward: bool,
    edge: int | None,
    offset: int,
    limit: int,
    field_bytes: int,
) -> list[Job]:
    """Up to ``limit`` of ``jobs``, newest (highest id) first, within the window that
    ``edge`` closes (``window_edge``): older than ``key``, or, with ``backward``, the
    ``limit`` newer than ``key`` nearest to it; ``offset`` rows skipped.

    Keyset pagination on the primary key (``id < key ORDER BY id DESC``): a page costs the
    same however deep, and stays put while jobs are added. It reads ids between the cursor
    and the edge only (at most LIST_WINDOW jobs in reach), through the primary key or
    pgqueue_job_tenant_id. Payloads, results and outputs come with their size (``payload_bytes``,
    ``result_bytes``: octet_length of their JSON text) and are only loaded when at most
    ``field_bytes`` (``payload_cut``, ``result_cut`` say otherwise), so a page of large
    payloads is never carried from the database.
    """
    annotations: dict[str, Any] = {}
    for field in ("payload", "result", "output"):
        size = Func(Cast(F(field), TextField()), function="octet_length")
        annotations[f"{field}_bytes"] = size
        annotations[f"{field}_cut"] = ExpressionWrapper(
            Q(**{f"{field}_bytes__gt": field_bytes}), output_field=BooleanField()
        )
        annotations[f"{field}_small"] = Case(
            When(**{f"{field}_bytes__lte": field_bytes}, then=F(field)), default=None
        )
    page = jobs.defer("payload", "result", "output").annotate(**annotations)
    if backward:
        assert key is not None
        page = page.filter(id__gt=key)
        if edge is not None:
            page = page.filter(id__lte=edge)
        rows = list(page.order_by("id")[offset : offset + limit])
        rows.reverse()
    else:
        if key is not None:
            page = page.filter(id__lt=key)
        if edge is not None:
            page = page.filter(id__gte=edge)
        rows = list(page.order_by("-id")[offset : offset + limit])
    for job in rows:
        job.payload = job.payload_small if not job.payload_cut else None
        job.result = job.result_small if not job.result_cut else None
        job.output = job.output_small if not job.output_cut else None
    return rows
