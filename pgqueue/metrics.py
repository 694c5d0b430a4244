"""Prometheus metrics: pgqueue's collector, next to django-prometheus's request metrics.

The collector queries the database at scrape time, so every process serving /metrics
(each gunicorn worker) reports the same numbers: nothing is kept per process, and no
multiprocess directory is needed for pgqueue's series. The gauges are ``pgqueue.reads``'s
figures, the same the dashboard and /stats show, and like them no scrape reads every job:
``pgqueue_jobs`` is exact for the live statuses (waiting, scheduled, queued, running: the
partial indexes), and for the finished ones (done, dead, cancelled) counts up to
``PGQUEUE["COUNT_CAP"]`` + 1 rows per queue, a lower bound past the cap (rates of finished
work come from ``pgqueue_job_outcomes``, which is exact and monotonic). The outcome
counters and run-time histograms come from pgqueue_task_stat, which maintenance keeps up to
date from the attempt history, so they are monotonic and cost a few rows per task to read.
The per-tenant wait and run-time histograms (``pgqueue_tenant_wait_seconds``,
``pgqueue_tenant_run_seconds``) come the same way from pgqueue_tenant_stat, whose rows are
bounded: METRICS_TENANT_SERIES tenants a queue, the rest summed as "(other)".
``pgqueue_workflows_live`` counts the workflows with an unfinished job from the partial
index of live workflow jobs (pgqueue_job_workflow_live): finished workflows cost nothing.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterator

from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from . import limit_reads, liveness, reads
from .conf import pgqueue_settings, queue_db
from .models import RUN_TIME_BUCKETS, TaskStat

TOP_TENANTS = 20
#: The tenant label of the per-tenant histograms' "other" series: not a valid tenant name,
#: so it can never be mistaken for one.
OTHER_TENANTS = "(other)"


class PgQueueCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "pgqueue_jobs",
            "Jobs by queue and status (done, dead, cancelled: counted up to COUNT_CAP + 1)",
            labels=["queue", "status"],
        )
        counts = reads.job_counts()
        for queue, statuses in counts.items():
            for status, n in statuses.items():
                jobs.add_metric([queue, status], int(n))
        yield jobs
        yield from self._limits(counts)

        oldest = GaugeMetricFamily(
            "pgqueue_oldest_runnable_age_seconds",
            "Age of the oldest runnable (queued) job, by queue",
            labels=["queue"],
        )
        now = timezone.now()
        for queue, run_at in reads.oldest_runnable().items():
            oldest.add_metric([queue], max(0.0, (now - run_at).total_seconds()))
        yield oldest

        backlog = GaugeMetricFamily(
            "pgqueue_tenant_backlog",
            f"Runnable and scheduled jobs of the {TOP_TENANTS} tenants with the largest backlogs",
            labels=["tenant"],
        )
        for tenant, _queued, _scheduled, n in reads.top_backlogs(TOP_TENANTS):
            backlog.add_metric([tenant], n)
        yield backlog

        keys, slots, waiting = reads.key_counts()
        yield GaugeMetricFamily(
            "pgqueue_keys_held", "Concurrency keys with at least one slot held", value=keys
        )
        yield GaugeMetricFamily(
            "pgqueue_key_slots_held",
            "Slots of concurrency keys held (jobs queued to run, running or awaiting a retry)",
            value=slots,
        )
        yield GaugeMetricFamily(
            "pgqueue_jobs_waiting_for_key",
            "Queued jobs waiting for their concurrency key (admission or a free slot)",
            value=waiting,
        )
        yield GaugeMetricFamily(
            "pgqueue_workers_alive", "Workers seen within a lease", value=liveness.workers_alive()
        )
        yield GaugeMetricFamily(
            "pgqueue_workflows_live",
            "Workflows with at least one unfinished (waiting, scheduled, queued or running) job",
            value=reads.live_workflows(),
        )
        yield from self._task_stats()
        yield from self._tenant_stats()

    def _limits(self, counts: dict[str, dict[str, int]]) -> Iterator[GaugeMetricFamily]:
        """Each limited scope's counter, cap, rate and pause (at most METRICS_LIMIT_SERIES
        rows: an operator creates them, so their number is bounded here, and
        ``pgqueue_limit_scopes`` says how many there are), and every queue's pause."""
        labels = ["scope", "queue", "tenant"]
        running = GaugeMetricFamily(
            "pgqueue_limit_running",
            "Jobs counted in a limited scope now (what its cap is checked against)",
            labels=labels,
        )
        cap = GaugeMetricFamily(
            "pgqueue_limit_max_running", "A scope's concurrency cap (max_running)", labels=labels
        )
        rate = GaugeMetricFamily(
            "pgqueue_limit_rate_per_second",
            "A scope's rate limit, in starts per second",
            labels=labels,
        )
        paused = GaugeMetricFamily(
            "pgqueue_limit_paused", "1 if a scope is paused, else 0", labels=labels
        )
        total, rows = limit_reads.exported_limits(int(pgqueue_settings.METRICS_LIMIT_SERIES))
        for row in rows:
            key = [row["scope"], row["queue"], row["tenant"]]
            running.add_metric(key, row["running"])
            paused.add_metric(key, int(row["paused"]))
            if row["max_running"] is not None:
                cap.add_metric(key, row["max_running"])
            if row["rate_per_second"] is not None:
                rate.add_metric(key, row["rate_per_second"])
        yield from (running, cap, rate, paused)
        yield GaugeMetricFamily(
            "pgqueue_limit_scopes",
            "Scopes with a cap, a rate limit or a pause (the pgqueue_limit_* series show at "
            "most METRICS_LIMIT_SERIES of them)",
            value=total,
        )
        queues = GaugeMetricFamily(
            "pgqueue_queue_paused",
            "1 if a queue is paused (for every tenant), else 0",
            labels=["queue"],
        )
        for summary in limit_reads.queue_summaries(counts=counts):
            queues.add_metric([summary["name"]], int(summary["paused"]))
        yield queues

    def _task_stats(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        """Outcomes and run time by task, from the totals maintenance keeps (a few rows per
        task). Attempts appear here some seconds after they finish."""
        rows: dict[tuple[str, str], list[tuple[float, int, float]]] = defaultdict(list)
        for task, outcome, le, count, seconds in TaskStat.objects.using(queue_db()).values_list(
            "task", "outcome", "le", "count", "seconds"
        ):
            rows[(task, outcome)].append((le, count, seconds))
        outcomes = CounterMetricFamily(
            "pgqueue_job_outcomes",
            "Finished attempts by task and outcome "
            "(done, failed, lease_expired, cancelled, snoozed)",
            labels=["task", "outcome"],
        )
        run_time = HistogramMetricFamily(
            "pgqueue_job_run_seconds",
            "Run time of finished attempts, by task and outcome",
            labels=["task", "outcome"],
        )
        for (task, outcome), buckets in sorted(rows.items()):
            total = sum(count for _, count, _ in buckets)
            outcomes.add_metric([task, outcome], total)
            cumulative, running = [], 0
            by_bound = {le: count for le, count, _ in buckets}
            for bound in RUN_TIME_BUCKETS:
                running += by_bound.get(bound, 0)
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            run_time.add_metric(
                [task, outcome], cumulative, sum_value=sum(s for _, _, s in buckets)
            )
        yield outcomes
        yield run_time

    def _tenant_stats(self) -> Iterator[HistogramMetricFamily]:
        """The wait from runnable to the handler's start and the run time of started
        attempts, by queue and tenant, from the totals maintenance folds: at most
        METRICS_TENANT_SERIES tenants a queue have series of their own, the others are
        summed in tenant="(other)" (TENANT_STAT_FOLD says which). Attempts appear here some
        seconds after they finish."""
        rows: dict[tuple[str, str, str], dict[float, tuple[int, float]]] = defaultdict(dict)
        for queue, tenant, kind, le, count, seconds in reads.tenant_stats():
            rows[(kind, queue, tenant or OTHER_TENANTS)][le] = (count, seconds)
        families = {
            "wait": HistogramMetricFamily(
                "pgqueue_tenant_wait_seconds",
                "Wait from runnable (enqueued, due, backoff ended) to the handler's start, by "
                f'queue and tenant (the busiest METRICS_TENANT_SERIES, the rest "{OTHER_TENANTS}")',
                labels=["queue", "tenant"],
            ),
            "run": HistogramMetricFamily(
                "pgqueue_tenant_run_seconds",
                "Run time of started attempts, by queue and tenant (the busiest "
                f'METRICS_TENANT_SERIES, the rest "{OTHER_TENANTS}")',
                labels=["queue", "tenant"],
            ),
        }
        for (kind, queue, tenant), by_bound in sorted(rows.items()):
            cumulative, running = [], 0
            for bound in RUN_TIME_BUCKETS:
                running += by_bound.get(bound, (0, 0.0))[0]
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            total = sum(seconds for _, seconds in by_bound.values())
            families[kind].add_metric([queue, tenant], cumulative, sum_value=total)
        yield from families.values()


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
    """The exposition text of this process's registry plus pgqueue's series.

    Under gunicorn with several worker processes, set PROMETHEUS_MULTIPROC_DIR (an empty
    directory shared by the processes, as prometheus_client documents): request metrics
    are then summed across the processes, whichever of them answers the scrape.
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(PgQueueCollector())
        return generate_latest(registry), CONTENT_TYPE_LATEST
    register()
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
