"""The operations dashboard: one admin page that answers "is the queue healthy right now?".

The admin serves ``dashboard_view`` at ``/admin/pgqueue/dashboard/`` (staff only). The page
re-reads everything on each refresh (every ``REFRESH_SECONDS``, by a ``<meta>`` refresh: no
script, no request leaves this server), so each read must stay cheap however large the job
table grows. The reads are ``pgqueue.reads``'s, which state their costs. In short:

* the counts by queue and status (``reads.job_counts``): the live statuses exact through
  their partial indexes, the finished ones counted up to ``PGQUEUE["COUNT_CAP"]`` through
  pgqueue_job_finished_queue and shown as "N+" past it, so the tile costs the same after a year;
* the live rows only (queued, scheduled) through the partial indexes the claim and promote
  statements use, for the backlog and the oldest runnable job;
* the last hour of ``pgqueue_job_attempt`` through its ``finished_at`` index, joined to the
  jobs for their tenant and task, for throughput, failures, shares, run times and each
  busy tenant's wait from runnable to start (its p50, p95 and longest: fairness, seen);
* ``pgqueue_worker``, which maintenance keeps to the workers seen within a day;
* the queues with runnable jobs that no live worker serves: one probe of the claim index
  per queue (``liveness.unserved_queues``);
* the limit rows (``pgqueue_limit``, one per scope an operator limited) of the queues and of
  the tenants shown, for their running / max_running, rate limits and pauses.

The number of queries is fixed (twelve), whatever the number of jobs, tenants or queues.
The data is gathered by ``dashboard_data`` and drawn by ``pgqueue.chart`` so both can be
tested without a browser.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.safestring import mark_safe

from . import limit_reads, liveness, reads
from .chart import throughput_chart_svg, wait_chart_svg
from .durations import format_seconds
from .models import Status

TEMPLATE = "admin/pgqueue/dashboard.html"
#: Seconds between the page's own reloads.
REFRESH_SECONDS = 10
#: Minutes on the throughput chart, one bucket each; the "last hour" of every section.
WINDOW_MINUTES = 60
#: Rows of the backlog-by-tenant table.
TOP_TENANTS = 10
#: Tenants of the wait-by-tenant table and chart (the busiest; the others as one row).
WAIT_TENANTS = 10
#: The label of that row.
OTHER_TENANTS = "(other tenants)"
#: Rows of the slowest-tasks table.
TOP_TASKS = 10
#: Most workers listed (the alive first); the counts above the list cover them all.
WORKERS_SHOWN = 50


def count_label(n: int) -> str:
    """A count as the page prints it: grouped digits, "N+" for a count that stopped at its
    bound (``reads.BoundedCount``)."""
    if isinstance(n, reads.BoundedCount):
        return number_format(int(n) - 1, 0, force_grouping=True) + "+"
    return number_format(n, 0, force_grouping=True)


def window(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The "last hour" every section uses: the ``WINDOW_MINUTES`` whole minutes up to and
    including the current one, so the chart's buckets and the totals beside it agree."""
    end = now.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    return end - dt.timedelta(minutes=WINDOW_MINUTES), end


# -- the sections: the read side's figures, with the strings the page prints ----------------


def _queues(now: dt.datetime, using: str | None) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Jobs by status overall, and each queue's counts (every status, zeros included) with
    the age of its oldest runnable job, and ``unserved``: it has runnable jobs and no live
    worker takes from it, so they wait whatever the backlog of the others."""
    by_queue = reads.job_counts(using=using)
    oldest = reads.oldest_runnable(using=using)
    unserved = set(liveness.unserved_queues(now, using=using))
    limited = {q["name"]: q for q in limit_reads.queue_summaries(counts=by_queue, using=using)}
    totals: dict[str, int] = dict.fromkeys(Status.values, 0)
    for counts in by_queue.values():
        for status, n in counts.items():
            totals[status] = n + totals.get(status, 0)  # a bounded count stays bounded
    queues = []
    for name in sorted(set(by_queue) | set(oldest) | set(limited)):
        counts = {**dict.fromkeys(Status.values, 0), **by_queue.get(name, {})}
        lim = limited.get(name) or {"max_running": None, "rate_limit": None, "paused": False}
        queued_at = oldest.get(name)
        age = max(0.0, (now - queued_at).total_seconds()) if queued_at else None
        queues.append(
            {
                "queue": name,
                "counts": counts,
                "labels": {status: count_label(n) for status, n in counts.items()},
                "oldest_queued_at": queued_at,
                "oldest_age_seconds": age,
                "oldest_age": format_seconds(age),
                "unserved": name in unserved,
                **limit_labels(lim, lim.get("running", counts[Status.RUNNING])),
            }
        )
    return totals, queues


def limit_labels(lim: dict[str, Any] | None, running: int) -> dict[str, Any]:
    """A scope's limits as the page prints them: ``cap_label`` is "running / max_running"
    (the running count alone without a cap), ``rate_label`` the rate or "—"."""
    lim = lim or {}
    max_running = lim.get("max_running")
    return {
        "max_running": max_running,
        "rate_limit": lim.get("rate_limit"),
        "paused": bool(lim.get("paused")),
        "cap_label": f"{running} / {max_running}" if max_running is not None else "—",
        "rate_label": lim.get("rate_limit") or "—",
    }


def _scope_label(lim: dict[str, Any]) -> str:
    """A tenant's limits in one queue, compactly: "1 / 2, 10/m, paused"."""
    labels = limit_labels(lim, lim["running"])
    parts = [labels["cap_label"], lim["rate_limit"] or "", "paused" if lim["paused"] else ""]
    return ", ".join(p for p in parts if p and p != "—") or "no limit"


def _tenants(
    since: dt.datetime, until: dt.datetime, using: str | None
) -> tuple[list[dict[str, Any]], int]:
    """The ``TOP_TENANTS`` tenants with the most queued + scheduled jobs, and the jobs done
    in the window (all tenants).

    A tenant's ``done_share`` is its fraction of those done jobs: next to its weight it shows
    whether fair scheduling gives each busy tenant what its weight promises.
    """
    rows, done_total = reads.top_backlogs_with_share(since, until, TOP_TENANTS, using=using)
    # With the queue-wide rows (a few): one query whether or not any tenant has a backlog.
    limits = limit_reads.scope_limits([t["name"] for t in rows], queues=True, using=using)
    tenants = []
    for t in rows:
        done = t["done_last_hour"]
        own = limits.get(("", t["name"]))
        per_queue = {q: lim for (q, name), lim in sorted(limits.items()) if name == t["name"] and q}
        tenants.append(
            {
                **t,
                **limit_labels(own, own["running"] if own else 0),
                "queue_limits_label": "; ".join(
                    f"{q}: {_scope_label(lim)}" for q, lim in per_queue.items()
                ),
                "queue_paused": any(lim["paused"] for lim in per_queue.values()),
                "weight_label": f"{t['weight']:g}",
                "queue_weights_label": ", ".join(
                    f"{q}: {w:g}" for q, w in t["queue_weights"].items()
                )
                or "—",
                "done_share": done / done_total if done_total else None,
                "share": f"{100 * done / done_total:.1f} %" if done_total else "—",
            }
        )
    return tenants, done_total


def _slowest(since: dt.datetime, until: dt.datetime, using: str | None) -> list[dict[str, Any]]:
    """The ``TOP_TASKS`` tasks with the longest mean run time over the window's done
    attempts, with their count and longest run."""
    return [
        {
            "task": task,
            "count": n,
            "mean_seconds": mean,
            "max_seconds": longest,
            "mean": format_seconds(mean),
            "max": format_seconds(longest),
        }
        for task, n, mean, longest in reads.slowest_tasks(since, until, TOP_TASKS, using=using)
    ]


def _waits(since: dt.datetime, until: dt.datetime, using: str | None) -> list[dict[str, Any]]:
    """The ``WAIT_TENANTS`` tenants with the most attempts that started and finished in the
    window, each with its wait from runnable to the handler's start (p50, p95, longest) and
    its run time's p95; the other tenants together last. Side by side they say whether
    every tenant is served on time: under fair scheduling a small tenant's p95 stays near
    the others' however large a neighbour's backlog."""
    return [
        {
            "tenant": row.tenant,
            "label": row.tenant if row.tenant is not None else OTHER_TENANTS,
            "attempts": row.attempts,
            "wait_p50_seconds": row.wait_p50,
            "wait_p95_seconds": row.wait_p95,
            "wait_max_seconds": row.wait_max,
            "run_p95_seconds": row.run_p95,
            "wait_p50": format_seconds(row.wait_p50),
            "wait_p95": format_seconds(row.wait_p95),
            "wait_max": format_seconds(row.wait_max),
            "run_p95": format_seconds(row.run_p95),
        }
        for row in reads.tenant_waits(since, until, WAIT_TENANTS, using=using)
    ]


def _workers(now: dt.datetime, using: str | None) -> dict[str, Any]:
    """Worker counts (alive, stale, stopped; see ``liveness.worker_state``) and the first
    ``WORKERS_SHOWN`` workers, the alive ones first."""
    overview = liveness.workers_overview(now, WORKERS_SHOWN, using=using)
    rows = []
    for w in overview["rows"]:
        seen = (now - w["last_seen_at"]).total_seconds()
        queues = w["queues"] if isinstance(w["queues"], list) else [w["queues"]]
        rows.append(
            {
                **w,
                "queues": ", ".join(str(q) for q in queues),
                "last_seen_seconds": seen,
                "last_seen": format_seconds(seen) + " ago" if seen >= 0 else "just now",
            }
        )
    return {**overview, "rows": rows}


def dashboard_data(now: dt.datetime | None = None, *, using: str | None = None) -> dict[str, Any]:
    """Everything the page shows, as plain numbers (and a few display strings).

    ``now`` is injectable so tests can place attempts in chosen minutes; it defaults to the
    application's clock. Twelve queries, whatever the size of the tables.
    """
    now = (now or timezone.now()).astimezone(dt.UTC)
    since, until = window(now)
    totals, queues = _queues(now, using)
    tenants, done_last_hour = _tenants(since, until, using)
    buckets = reads.throughput_buckets(since, WINDOW_MINUTES, using=using)
    return {
        "now": now,
        "since": since,
        "until": until,
        "statuses": totals,
        "total_jobs": sum(totals.values()),
        "total_jobs_label": count_label(sum(totals.values())),
        "queues": queues,
        "tenants": tenants,
        # With no backlog to list, the tenant query has no row to carry the hour's total:
        # the chart's buckets cover the same window.
        "done_last_hour": done_last_hour if tenants else sum(b.done for b in buckets),
        "buckets": buckets,
        "done_in_chart": sum(b.done for b in buckets),
        "failed_in_chart": sum(b.failed for b in buckets),
        "workers": _workers(now, using),
        "slowest": _slowest(since, until, using),
        "waits": _waits(since, until, using),
    }


# -- the view ----------------------------------------------------------------------------


#: The permission the dashboard asks of a staff user (as the API's /stats does).
VIEW_PERMISSION = "pgqueue.view_job"


def dashboard_view(request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
    """Render the dashboard inside the admin's frame.

    ``context`` is ``admin.site.each_context(request)``; the admin wraps this view in
    ``admin_view`` (staff only). The check below repeats that, at no cost, so the page can't
    leak the queue's state if it is ever mounted without the wrapper, and asks what GET
    /stats asks of a session: ``pgqueue.view_job`` (every tenant's backlog is on the page).
    """
    user = getattr(request, "user", None)
    if user is None or not (user.is_active and user.is_staff and user.has_perm(VIEW_PERMISSION)):
        raise PermissionDenied
    data = dashboard_data()
    chart = throughput_chart_svg(data["buckets"])
    waits = wait_chart_svg(
        [
            (w["label"], w["wait_p50_seconds"], w["wait_p95_seconds"], w["attempts"])
            for w in data["waits"]
        ]
    )
    return render(
        request,
        TEMPLATE,
        {
            **context,
            "title": "pgqueue dashboard",
            "d": data,
            "chart": mark_safe(chart),  # every text in it is escaped
            "wait_chart": mark_safe(waits),  # likewise
            "refresh_seconds": REFRESH_SECONDS,
            "window_minutes": WINDOW_MINUTES,
            "wait_tenants": WAIT_TENANTS,
            "statuses": [
                (s.label, s.value, count_label(data["statuses"].get(s.value, 0))) for s in Status
            ],
        },
    )
