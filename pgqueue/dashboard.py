"""The operations dashboard: one admin page that answers "is the queue healthy right now?".

The admin serves ``dashboard_view`` at ``/admin/pgqueue/dashboard/`` (staff only). The page
re-reads everything on each refresh (every ``REFRESH_SECONDS``, by a ``<meta>`` refresh: no
script, no request leaves this server), so each query here must stay cheap however large the
job table grows. Every query states its cost next to it. In short:

* one sequential scan of ``pgqueue_job`` for the counts by status (the finished statuses
  are as large as the history; counting them exactly is the point of that tile);
* the live rows only (queued, scheduled) through the partial indexes the claim and promote
  statements use, for the backlog and the oldest runnable job;
* the last hour of ``pgqueue_job_attempt`` through its ``finished_at`` index, joined to the
  jobs for their tenant and task, for throughput, failures, shares and run times;
* ``pgqueue_worker``, which maintenance keeps to the workers seen within a day.

The number of queries is fixed (seven), whatever the number of jobs, tenants or queues.
The data is gathered by ``dashboard_data`` and drawn by ``pgqueue.chart`` so both can be
tested without a browser.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import (
    Avg,
    BooleanField,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Min,
    Q,
)
from django.db.models.functions import TruncMinute
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import mark_safe

from .chart import throughput_chart_svg
from .conf import pgqueue_settings
from .durations import format_seconds
from .models import Job, JobAttempt, Outcome, Status, Worker

TEMPLATE = "admin/pgqueue/dashboard.html"
#: Seconds between the page's own reloads.
REFRESH_SECONDS = 10
#: Minutes on the throughput chart, one bucket each; the "last hour" of every section.
WINDOW_MINUTES = 60
#: Rows of the backlog-by-tenant table.
TOP_TENANTS = 10
#: Rows of the slowest-tasks table.
TOP_TASKS = 10
#: Most workers listed (the alive first); the counts above the list cover them all.
WORKERS_SHOWN = 50

FAILED_OUTCOMES = (Outcome.FAILED, Outcome.LEASE_EXPIRED)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One minute of the throughput chart: attempts that finished within it."""

    minute: dt.datetime  # the start of the minute, in UTC
    done: int
    failed: int  # failed + lease_expired


def window(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The "last hour" every section uses: the ``WINDOW_MINUTES`` whole minutes up to and
    including the current one, so the chart's buckets and the totals beside it agree."""
    end = now.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    return end - dt.timedelta(minutes=WINDOW_MINUTES), end


# -- the sections ------------------------------------------------------------------------


def status_counts(*, using: str = "default") -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Jobs by status, overall and by queue: ``(totals, {queue: {status: n}})``.

    Cost: one sequential scan of pgqueue_job (a GROUP BY over every row), the only query of
    the page that grows with the history; grouping by queue as well costs nothing more.
    """
    totals = dict.fromkeys(Status.values, 0)
    queues: dict[str, dict[str, int]] = {}
    rows = Job.objects.using(using).values_list("queue", "status").annotate(n=Count("id"))
    for queue, status, n in rows.order_by():
        totals[status] = totals.get(status, 0) + n
        queues.setdefault(queue, dict.fromkeys(Status.values, 0))[status] = n
    return totals, queues


def oldest_runnable(*, using: str = "default") -> dict[str, dt.datetime]:
    """When the oldest queued job of each queue became runnable (its ``run_at``).

    Cost: the queued rows only, which the partial index pgqueue_job_claim covers; bounded by
    the runnable backlog, not by the history.
    """
    rows = (
        Job.objects.using(using)
        .filter(status=Status.QUEUED)
        .values("queue")
        .annotate(oldest=Min("run_at"))
        .values_list("queue", "oldest")
        .order_by()
    )
    return dict(rows)


#: Top tenants by backlog, with their weights and their share of the done attempts.
#: Cost: the queued and scheduled rows only, through a BitmapOr of the partial indexes
#: pgqueue_job_claim and pgqueue_job_scheduled (written as OR: the planner matches partial
#: indexes to the arms of an OR, not to an IN list, which would scan the whole table); the
#: window's done attempts through pgqueue_attempt_finished, joined to their jobs (by primary
#: key, or by one hashed scan when the planner reckons the hour a large part of the table);
#: lookups for the (at most TOP_TENANTS) tenants' weights and per-queue weights.
TENANT_BACKLOG_SQL = """
WITH backlog AS (
    SELECT tenant,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           count(*) AS backlog
      FROM pgqueue_job
     WHERE status = 'queued' OR status = 'scheduled'
     GROUP BY tenant
     ORDER BY backlog DESC, tenant
     LIMIT %(limit)s
), done AS (
    SELECT j.tenant, count(*) AS n
      FROM pgqueue_job_attempt a
      JOIN pgqueue_job j ON j.id = a.job_id
     WHERE a.outcome = 'done' AND a.finished_at >= %(since)s AND a.finished_at < %(until)s
     GROUP BY j.tenant
)
SELECT b.tenant, b.queued, b.scheduled, b.backlog, t.weight,
       ARRAY(SELECT qw.queue FROM pgqueue_queue_weight qw
              WHERE qw.tenant = b.tenant ORDER BY qw.queue),
       ARRAY(SELECT qw.weight FROM pgqueue_queue_weight qw
              WHERE qw.tenant = b.tenant ORDER BY qw.queue),
       COALESCE(d.n, 0),
       (SELECT COALESCE(sum(n), 0) FROM done)
  FROM backlog b
  LEFT JOIN pgqueue_tenant t ON t.name = b.tenant
  LEFT JOIN done d ON d.tenant = b.tenant
 ORDER BY b.backlog DESC, b.tenant
"""


def tenant_backlog(
    since: dt.datetime, until: dt.datetime, *, using: str = "default"
) -> tuple[list[dict[str, Any]], int]:
    """The ``TOP_TENANTS`` tenants with the most queued + scheduled jobs, and the number of
    jobs done in the window (all tenants), in one statement (see ``TENANT_BACKLOG_SQL``).

    A tenant's ``done_share`` is its fraction of those done jobs: next to its weight it shows
    whether fair scheduling gives each busy tenant what its weight promises.
    """
    params = {"limit": TOP_TENANTS, "since": since, "until": until}
    with connections[using].cursor() as cursor:
        cursor.execute(TENANT_BACKLOG_SQL, params)
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
            "weight_label": f"{weight if weight is not None else 1.0:g}",
            "queue_weights_label": ", ".join(
                f"{q}: {w:g}" for q, w in zip(qw_queues, qw_weights, strict=True)
            )
            or "—",
            "done_last_hour": done,
            "done_share": done / done_total if done_total else None,
            "share": f"{100 * done / done_total:.1f} %" if done_total else "—",
        }
        for name, queued, scheduled, backlog, weight, qw_queues, qw_weights, done, _ in rows
    ]
    return tenants, done_total


def throughput_buckets(
    since: dt.datetime, until: dt.datetime, *, using: str = "default"
) -> list[Bucket]:
    """Done and failed (failed + lease_expired) attempts per minute, one bucket per minute of
    the window, zeros included, oldest first.

    Cost: the window's rows of pgqueue_job_attempt through pgqueue_attempt_finished, grouped
    by date_trunc('minute', finished_at): at most WINDOW_MINUTES rows come back.
    """
    rows = (
        JobAttempt.objects.using(using)
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
    for i in range(WINDOW_MINUTES):
        minute = since + dt.timedelta(minutes=i)
        done, failed = found.get(minute, (0, 0))
        buckets.append(Bucket(minute, done, failed))
    return buckets


def slowest_tasks(
    since: dt.datetime, until: dt.datetime, *, using: str = "default"
) -> list[dict[str, Any]]:
    """The ``TOP_TASKS`` task names with the longest mean run time (finished_at - started_at)
    over the window's done attempts, with their count and longest run.

    Cost: the window's done attempts through pgqueue_attempt_finished, each joined to its job
    by primary key for the task name.
    """
    run = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    rows = (
        JobAttempt.objects.using(using)
        .filter(
            outcome=Outcome.DONE,
            finished_at__gte=since,
            finished_at__lt=until,
            started_at__isnull=False,
        )
        .values("job__task")
        .annotate(n=Count("id"), mean=Avg(run), longest=Max(run))
        .values_list("job__task", "n", "mean", "longest")
        .order_by("-mean", "job__task")[:TOP_TASKS]
    )
    return [
        {
            "task": task,
            "count": n,
            "mean_seconds": mean.total_seconds(),
            "max_seconds": longest.total_seconds(),
            "mean": format_seconds(mean.total_seconds()),
            "max": format_seconds(longest.total_seconds()),
        }
        for task, n, mean, longest in rows
    ]


def workers(now: dt.datetime, *, using: str = "default") -> dict[str, Any]:
    """Worker counts (alive: seen within LEASE_SECONDS and not stopped; stale: not stopped but
    silent longer, so its leases are lost or about to be; stopped) and the first
    ``WORKERS_SHOWN`` workers, the alive ones first.

    Cost: two reads of pgqueue_worker, which maintenance prunes to the workers seen within a
    day (a few rows per worker process).
    """
    lease = float(pgqueue_settings.LEASE_SECONDS)
    since = now - dt.timedelta(seconds=lease)
    alive_q = Q(stopped_at__isnull=True, last_seen_at__gte=since)
    table = Worker.objects.using(using)
    counts = table.aggregate(
        alive=Count("id", filter=alive_q),
        stopped=Count("id", filter=Q(stopped_at__isnull=False)),
        total=Count("id"),
    )
    listed = (
        table.annotate(alive=ExpressionWrapper(alive_q, output_field=BooleanField()))
        .order_by("-alive", F("stopped_at").asc(nulls_first=True), "host", "pid", "id")
        .values("id", "host", "pid", "queues", "concurrency", "last_seen_at", "stopped_at")[
            :WORKERS_SHOWN
        ]
    )
    rows = []
    for w in listed:
        if w["stopped_at"] is not None:
            state = "stopped"
        elif w["last_seen_at"] >= since:
            state = "alive"
        else:
            state = "stale"
        seen = (now - w["last_seen_at"]).total_seconds()
        queues = w["queues"] if isinstance(w["queues"], list) else [w["queues"]]
        rows.append(
            {
                **w,
                "queues": ", ".join(str(q) for q in queues),
                "state": state,
                "last_seen_seconds": seen,
                "last_seen": format_seconds(seen) + " ago" if seen >= 0 else "just now",
            }
        )
    return {
        "alive": counts["alive"],
        "stale": counts["total"] - counts["alive"] - counts["stopped"],
        "stopped": counts["stopped"],
        "total": counts["total"],
        "rows": rows,
        "lease_seconds": lease,
    }


def dashboard_data(now: dt.datetime | None = None, *, using: str = "default") -> dict[str, Any]:
    """Everything the page shows, as plain numbers (and a few display strings).

    ``now`` is injectable so tests can place attempts in chosen minutes; it defaults to the
    application's clock. Seven queries, whatever the size of the tables.
    """
    now = (now or timezone.now()).astimezone(dt.UTC)
    since, until = window(now)
    totals, by_queue = status_counts(using=using)
    oldest = oldest_runnable(using=using)
    tenants, done_last_hour = tenant_backlog(since, until, using=using)
    buckets = throughput_buckets(since, until, using=using)
    queues = []
    for name in sorted(set(by_queue) | set(oldest)):
        queued_at = oldest.get(name)
        age = max(0.0, (now - queued_at).total_seconds()) if queued_at else None
        queues.append(
            {
                "queue": name,
                "counts": by_queue.get(name, dict.fromkeys(Status.values, 0)),
                "oldest_queued_at": queued_at,
                "oldest_age_seconds": age,
                "oldest_age": format_seconds(age),
            }
        )
    return {
        "now": now,
        "since": since,
        "until": until,
        "statuses": totals,
        "total_jobs": sum(totals.values()),
        "queues": queues,
        "tenants": tenants,
        # With no backlog to list, the tenant query has no row to carry the hour's total:
        # the chart's buckets cover the same window.
        "done_last_hour": done_last_hour if tenants else sum(b.done for b in buckets),
        "buckets": buckets,
        "done_in_chart": sum(b.done for b in buckets),
        "failed_in_chart": sum(b.failed for b in buckets),
        "workers": workers(now, using=using),
        "slowest": slowest_tasks(since, until, using=using),
    }


# -- the view ----------------------------------------------------------------------------


def dashboard_view(request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
    """Render the dashboard inside the admin's frame.

    ``context`` is ``admin.site.each_context(request)``; the admin wraps this view in
    ``admin_view`` (staff only). The check below repeats that, at no cost, so the page can't
    leak the queue's state if it is ever mounted without the wrapper.
    """
    user = getattr(request, "user", None)
    if user is None or not (user.is_active and user.is_staff):
        raise PermissionDenied
    data = dashboard_data()
    chart = throughput_chart_svg(data["buckets"])
    return render(
        request,
        TEMPLATE,
        {
            **context,
            "title": "pgqueue dashboard",
            "d": data,
            "chart": mark_safe(chart),  # every text in it is escaped
            "refresh_seconds": REFRESH_SECONDS,
            "window_minutes": WINDOW_MINUTES,
            "statuses": [(s.label, s.value, data["statuses"].get(s.value, 0)) for s in Status],
        },
    )
