"""The limits of a scope: a concurrency cap, a rate limit, a pause, and the counter that
makes the cap exact.

Kept apart from ``models`` (imported at its end, so Django registers it with the app). The
claim reads and changes these rows in the statements of ``pgqueue/queries/claim.sql``;
``pgqueue.limits`` is the service that sets them. See docs/explanation/architecture.md, "Caps, rate
limits and pause".
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

#: Bounds of ``max_running`` and of a rate limit's N (inclusive); the CHECKs hold them too.
MAX_RUNNING_BOUND = 100_000
RATE_COUNT_BOUND = 1_000_000
#: A rate limit's periods, by DRF's throttle-rate letter.
RATE_PERIODS = {"s": 1, "m": 60, "h": 3600}


class Limit(models.Model):
    """One scope's limits: a queue (``tenant`` empty), a tenant in every queue (``queue``
    empty), or a tenant in one queue. Every scope that applies to a job holds: a
    (queue, tenant) row narrows the tenant's limits in that queue, it does not lift them.

    ``running`` counts the jobs running now that were counted in this row (a job records
    the rows it was counted in, ``Job.limit_ids``). It changes only under the row's lock
    (the claim's FOR UPDATE, the decrement of every exit from running), which is what
    makes a cap exact; maintenance recounts it now and then as a safety net. A row with
    no limit left counts nothing new (the claim counts a job only in rows that limit
    something), and maintenance deletes it once it counts none and holds back no gated
    job.

    The rate limit is a token bucket: ``rate_count`` tokens per ``rate_seconds``, holding
    at most ``max(1, ceil(rate_count / 10))`` (the burst); ``tokens`` as of ``refilled_at``.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=64, default="", blank=True)
    tenant = models.CharField(max_length=64, default="", blank=True)
    max_running = models.IntegerField(null=True, blank=True)
    rate_count = models.IntegerField(null=True, blank=True)
    rate_seconds = models.IntegerField(null=True, blank=True)
    tokens = models.FloatField(default=0.0)
    refilled_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    running = models.IntegerField(default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_limit"
        constraints = [
            # The claim's and the enqueue's lookups: (tenant, queue IN ('', q)).
            models.UniqueConstraint(fields=["tenant", "queue"], name="pgqueue_limit_scope"),
            models.CheckConstraint(
                condition=~Q(queue="", tenant=""), name="pgqueue_limit_has_scope"
            ),
            models.CheckConstraint(
                condition=Q(max_running__isnull=True)
                | Q(max_running__gte=1, max_running__lte=MAX_RUNNING_BOUND),
                name="pgqueue_limit_max_running_range",
            ),
            models.CheckConstraint(
                condition=Q(rate_count__isnull=True, rate_seconds__isnull=True)
                | Q(
                    rate_count__gte=1,
                    rate_count__lte=RATE_COUNT_BOUND,
                    rate_seconds__in=list(RATE_PERIODS.values()),
                ),
                name="pgqueue_limit_rate_valid",
            ),
            models.CheckConstraint(condition=Q(running__gte=0), name="pgqueue_limit_running"),
        ]

    def __str__(self) -> str:
        return f"limits of {self.queue or '*'}/{self.tenant or '*'}"

    @property
    def rate_limit(self) -> str | None:
        """The rate limit in DRF's form ("50/s"), or None."""
        if self.rate_count is None:
            return None
        letter = next(k for k, v in RATE_PERIODS.items() if v == self.rate_seconds)
        return f"{self.rate_count}/{letter}"
