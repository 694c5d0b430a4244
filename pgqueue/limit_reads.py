"""The read side of limits: a scope's limits with its running count, the queues' limits,
and why a waiting job is not running yet ("Why isn't my job running?").

Every read here is bounded: limit rows are one per limited scope, and a job's place in
line is a count over the claim index (or its tenant's gated jobs) that stops at
COUNT_CAP + 1.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.models import Q
from django.utils import timezone

from . import read_sql
from .conf import queue_db
from .key_models import KeyState
from .limit_models import Limit
from .models import Job, Status
from .reads import count_cap


def tokens_now(row: Limit, now: dt.datetime | None = None) -> float | None:
    """The row's tokens now (the bucket refills between claims), or None: no rate limit."""
    if row.rate_count is None:
        return None
    burst = max(1, math.ceil(row.rate_count / 10))
    elapsed = ((now or timezone.now()) - (row.refilled_at or timezone.now())).total_seconds()
    return min(burst, row.tokens + max(elapsed, 0.0) * row.rate_count / row.rate_seconds)


def describe(row: Limit | None) -> dict[str, Any]:
    """A scope's limits as the API shows them (no row: none)."""
    if row is None:
        return {"max_running": None, "rate_limit": None, "paused": False}
    return {"max_running": row.max_running, "rate_limit": row.rate_limit, "paused": row.paused}


def tenant_limits(names: Iterable[str], *, using: str | None = None) -> dict[str, dict[str, Any]]:
    """For each tenant named: its own limits and ``queue_limits`` ({queue: limits}), for the
    tenant's JSON (GET /tenants). Tenants without limits get the empty form."""
    names = list(names)
    found: dict[str, dict[str, Any]] = {n: {**describe(None), "queue_limits": {}} for n in names}
    for row in Limit.objects.using(queue_db(using)).filter(tenant__in=names):
        if row.queue:
            found[row.tenant]["queue_limits"][row.queue] = {**describe(row), "running": row.running}
        else:
            found[row.tenant].update(describe(row))
    return found


def queue_summaries(
    names: Iterable[str] | None = None,
    *,
    counts: dict[str, dict[str, int]] | None = None,
    using: str | None = None,
) -> list[dict[str, Any]]:
    """Queues (those with jobs or limits, or those named) with their limits and their
    ``running`` jobs, by name: GET /queues. ``running`` is the queue's counter when it has
    a cap or a rate (the figure the cap is checked against), else its running jobs.

    ``counts`` is ``reads.job_counts()`` when the caller has read it already (the
    dashboard, the CLI's ``queues``), so that a page reads the jobs' counts once."""
    from .reads import job_counts

    counts = job_counts(using=using) if counts is None else counts
    rows = {r.queue: r for r in Limit.objects.using(queue_db(using)).filter(tenant="")}
    wanted = sorted(set(counts) | set(rows)) if names is None else sorted(set(names))
    out = []
    for name in wanted:
        row = rows.get(name)
        limited = row is not None and (row.max_running is not None or row.rate_count is not None)
        running = row.running if limited else counts.get(name, {}).get(Status.RUNNING, 0)
        out.append({"name": name, **describe(row), "running": running})
    return out


def scope_limits(
    tenants: Iterable[str] = (), *, queues: bool = False, using: str | None = None
) -> dict[tuple[str, str], dict[str, Any]]:
    """The limit rows of the tenants named (their own, queue "", and per queue) and, with
    ``queues``, every queue-wide row (tenant ""), keyed ``(queue, tenant)``: their limits
    and ``running``, the jobs counted in the row (what its cap is checked against). One
    read of pgqueue_limit (a row per limited scope), for a page of the admin or the
    dashboard's tables."""
    wanted = Q(tenant__in=list(tenants))
    if queues:
        wanted |= Q(tenant="")
    return {
        (row.queue, row.tenant): {**describe(row), "running": row.running}
        for row in Limit.objects.using(queue_db(using)).filter(wanted)
    }


def exported_limits(limit: int, *, using: str | None = None) -> tuple[int, list[dict[str, Any]]]:
    """How many limit rows limit anything, and up to ``limit`` of them (LIMIT_ROWS_EXPORTED:
    the queues' first), with their ``scope`` ("queue", "tenant" or "queue_tenant"), for
    the Prometheus gauges. The operator creates these rows, so their number is theirs;
    ``limit`` (METRICS_LIMIT_SERIES) bounds the series a scrape carries whatever it is."""
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.LIMIT_ROWS_EXPORTED, {"limit": limit})
        rows = cursor.fetchall()
    out = []
    for queue, tenant, max_running, rate_count, rate_seconds, paused, running, _ in rows:
        scope = "queue_tenant" if queue and tenant else "tenant" if tenant else "queue"
        out.append(
            {
                "scope": scope,
                "queue": queue,
                "tenant": tenant,
                "max_running": max_running,
                "rate_per_second": None if rate_count is None else rate_count / rate_seconds,
                "paused": paused,
                "running": running,
            }
        )
    return (rows[0][-1] if rows else 0), out


def waiting_for(job: Job, *, using: str | None = None, position: bool = True) -> dict[str, Any]:
    """Why a scheduled or queued job waits: ``{"waiting_for": reason, "position": ...}``.

    Reasons: "backoff" (scheduled after a failed attempt), "run_at" (scheduled for later),
    "key_cap" (its concurrency key's slots are all held, or it is about to be admitted),
    "paused", "tenant_cap", "queue_cap", "rate_limit", or "turn" with ``position``, the
    jobs ahead of it in line, up to COUNT_CAP ("1000+" past it; None without
    ``position``: not counted). Both None for a job that is running or finished. A
    snapshot: the claim decides a moment later.
    """
    if job.status == Status.SCHEDULED:
        return {"waiting_for": "backoff" if job.attempts > 0 else "run_at", "position": None}
    if job.status != Status.QUEUED:
        return {"waiting_for": None, "position": None}
    if job.key_state in (KeyState.NEW, KeyState.WAITING):
        return {"waiting_for": "key_cap", "position": None}
    rows = list(
        Limit.objects.using(queue_db(using)).filter(
            Q(tenant="", queue=job.queue) | Q(tenant=job.tenant_id, queue__in=["", job.queue])
        )
    )
    now = timezone.now()
    by_kind: dict[str, list[Limit]] = defaultdict(list)
    for row in rows:
        by_kind["queue" if not row.tenant else "tenant"].append(row)
    if any(r.paused for r in rows):
        return {"waiting_for": "paused", "position": None}
    for kind in ("tenant", "queue"):
        if kind == "tenant" and not job.gated:
            continue
        for row in by_kind[kind]:
            if row.max_running is not None and row.running >= row.max_running:
                return {"waiting_for": f"{kind}_cap", "position": None}
            tokens = tokens_now(row, now)
            if tokens is not None and tokens < 1:
                return {"waiting_for": "rate_limit", "position": None}
    return {"waiting_for": "turn", "position": _position(job, using) if position else None}


def _position(job: Job, using: str | None) -> str:
    """Jobs ahead of ``job`` in its line (the claim index's order), counted up to the cap."""
    cap = count_cap()
    ahead = (
        Q(priority__gt=job.priority)
        | Q(priority=job.priority, vtime__lt=job.vtime)
        | Q(priority=job.priority, vtime=job.vtime, id__lt=job.id)
    )
    line = Job.objects.using(queue_db(using)).filter(
        queue=job.queue, status=Status.QUEUED, gated=job.gated
    )
    if job.gated:
        line = line.filter(tenant_id=job.tenant_id)
    n = line.filter(ahead)[: cap + 1].count()
    return f"{cap}+" if n > cap else str(n)
