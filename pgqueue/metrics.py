"""Prometheus metrics: pgqueue's collector, next to django-prometheus's request metrics.

The collector queries the database at scrape time, so every process serving /metrics
(each gunicorn worker) reports the same numbers: nothing is kept per process, and no
multiprocess directory is needed for pgqueue's series.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from . import reports
from .models import Job, Status

TOP_TENANTS = 20


class PgQueueCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "pgqueue_jobs", "Jobs by queue and status", labels=["queue", "status"]
        )
        for queue, status, n in Job.objects.values_list("queue", "status").annotate(n=Count("id")):
            jobs.add_metric([queue, status], n)
        yield jobs

        oldest = GaugeMetricFamily(
            "pgqueue_oldest_runnable_age_seconds",
            "Age of the oldest runnable (queued) job, by queue",
            labels=["queue"],
        )
        now = timezone.now()
        for queue, run_at in (
            Job.objects.filter(status=Status.QUEUED)
            .values("queue")
            .annotate(oldest=Min("run_at"))
            .values_list("queue", "oldest")
            .order_by()
        ):
            oldest.add_metric([queue], max(0.0, (now - run_at).total_seconds()))
        yield oldest

        backlog = GaugeMetricFamily(
            "pgqueue_tenant_backlog",
            f"Runnable and scheduled jobs of the {TOP_TENANTS} tenants with the largest backlogs",
            labels=["tenant"],
        )
        for tenant, n in (
            Job.objects.filter(status__in=[Status.QUEUED, Status.SCHEDULED])
            .values_list("tenant_id")
            .annotate(n=Count("id"))
            .order_by("-n")[:TOP_TENANTS]
        ):
            backlog.add_metric([tenant], n)
        yield backlog

        yield GaugeMetricFamily(
            "pgqueue_workers_alive", "Workers seen within a lease", value=reports.workers_alive()
        )


_registered = False
_lock = threading.Lock()


def register() -> None:
    """Add pgqueue's collector to the default registry, once per process."""
    global _registered
    with _lock:
        if not _registered:
            REGISTRY.register(PgQueueCollector())
            _registered = True


def render() -> tuple[bytes, str]:
    register()
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
