"""The periodic schedules' table (see pgqueue/schedules.py); part of pgqueue.models."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .models import NAME_MAX


class Missed(models.TextChoices):
    """What a schedule does with ticks that passed while no worker ran."""

    RUN_ONCE = "run_once"  # one job for the latest of them, when a worker is back
    SKIP = "skip"  # none: the schedule waits for its next tick


class PeriodicSchedule(models.Model):
    """A periodic job: code declares it, the worker's start-up sync copies it here.

    Code owns every column but ``enabled`` (the operator's switch, which a deploy never
    resets) and the bookkeeping ones (``next_run_at``, ``last_run_at``, ``last_job_id``,
    ``removed_at``). ``next_run_at`` is the next tick, as an instant; the maintenance duty
    ``enqueue_due_periodic`` moves it forward with a compare-and-set when it enqueues.
    """

    name = models.CharField(max_length=150, unique=True)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64)
    task = models.CharField(max_length=200)
    tenant = models.CharField(max_length=NAME_MAX)
    queue = models.CharField(max_length=NAME_MAX)
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.IntegerField(default=5)
    payload = models.JSONField(null=True, blank=True)
    missed = models.CharField(max_length=16, choices=Missed.choices, default=Missed.RUN_ONCE)
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField()
    last_run_at = models.DateTimeField(null=True, blank=True)
    # The job of the last tick; no foreign key, so pruning finished jobs is not blocked.
    last_job_id = models.BigIntegerField(null=True, blank=True)
    # Set when a start-up sync no longer finds the schedule in code; it stops running.
    removed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_periodic"
        verbose_name = "periodic schedule"
        indexes = [
            # "Which schedules are due?" (PERIODIC_LOCK_DUE): only the live ones are in it.
            models.Index(
                fields=["next_run_at"],
                name="pgqueue_periodic_due",
                condition=Q(enabled=True, removed_at__isnull=True),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(missed__in=["run_once", "skip"]), name="pgqueue_periodic_missed"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron})"
