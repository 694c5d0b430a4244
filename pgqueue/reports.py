"""Read-side queries for the HTTP API, the admin and metrics: summaries, not hot paths."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db.models import Avg, Count, F, Q
from django.utils import timezone

from .conf import pgqueue_settings
from .models import Job, JobAttempt, QueueWeight, Status, Tenant, Worker

WINDOW = dt.timedelta(seconds=60)


def tenant_summaries(
    names: Iterable[str] | None = None, *, using: str = "default"
) -> list[dict[str, Any]]:
    """Weight, per-queue weights and job counts of tenants (all, or those named)."""
    tenants = Tenant.objects.using(using).order_by("name")
    if names is not None:
        tenants = tenants.filter(name__in=list(names))
    tenants = list(tenants)
    wanted = [t.name for t in tenants]
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = (
        Job.objects.using(using)
        .filter(tenant_id__in=wanted)
        .values_list("tenant_id", "status")
        .annotate(n=Count("id"))
    )
    for tenant, status, n in rows:
        counts[tenant][status] = n
    overrides: dict[str, dict[str, float]] = defaultdict(dict)
    for qw in QueueWeight.objects.using(using).filter(tenant_id__in=wanted):
        overrides[qw.tenant_id][qw.queue] = qw.weight
    return [
        {
            "name": t.name,
            "weight": t.weight,
            "queue_weights": overrides[t.name],
            "backlog": counts[t.name][Status.QUEUED] + counts[t.name][Status.SCHEDULED],
            "running": counts[t.name][Status.RUNNING],
            "done": counts[t.name][Status.DONE],
            "dead": counts[t.name][Status.DEAD],
            "created_at": t.created_at,
        }
        for t in tenants
    ]


def workers_alive(*, using: str = "default") -> int:
    """Workers seen within a lease: one that has not renewed its leases for that long has
    lost them anyway."""
    since = timezone.now() - dt.timedelta(seconds=float(pgqueue_settings.LEASE_SECONDS))
    return (
        Worker.objects.using(using).filter(stopped_at__isnull=True, last_seen_at__gte=since).count()
    )


def stats(*, using: str = "default") -> dict[str, Any]:
    """Counts by queue and status, and the last minute's throughput, errors and run time."""
    queues: dict[str, dict[str, int]] = defaultdict(dict)
    for queue, status, n in (
        Job.objects.using(using).values_list("queue", "status").annotate(n=Count("id"))
    ):
        queues[queue][status] = n
    since = timezone.now() - WINDOW
    recent = (
        JobAttempt.objects.using(using)
        .filter(finished_at__gte=since)
        .aggregate(
            done=Count("id", filter=Q(outcome="done")),
            errors=Count("id", filter=Q(outcome__in=["failed", "lease_expired"])),
            run=Avg(F("finished_at") - F("started_at"), filter=Q(outcome="done")),
        )
    )
    finished = recent["done"] + recent["errors"]
    run = recent["run"]
    return {
        "queues": {q: dict(sorted(s.items())) for q, s in sorted(queues.items())},
        "throughput_per_s_60s": round(recent["done"] / WINDOW.total_seconds(), 3),
        "error_rate_60s": round(recent["errors"] / finished, 4) if finished else 0.0,
        "mean_run_seconds_60s": round(run.total_seconds(), 6) if run is not None else None,
        "workers_alive": workers_alive(using=using),
        "dead": sum(s.get(Status.DEAD, 0) for s in queues.values()),
    }
