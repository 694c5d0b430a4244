"""The periodic schedules' table (see pgqueue/schedules.py); part of pgqueue.models."""

from __future__ import annotations

import datetime as dt

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .models import NAME_MAX


class Missed(models.TextChoices):
    """What a schedule does with ticks that passed while no worker ran."""

    RUN_ONCE = "run_once"  # one job for the latest of them, when a worker is back
    SKIP = "skip"  # none: the schedule waits for its next tick


class Source(models.TextChoices):
    """Who owns a schedule's definition."""

    CODE = "code"  # @pgqueue.periodic or PGQUEUE["PERIODIC"], copied by the start-up sync
    ADMIN = "admin"  # created by an operator (pgqueue.schedules.create_schedule)


class PeriodicSchedule(models.Model):
    """A periodic job: declared in code (the worker's start-up sync copies it here) or
    created in the admin (``source``).

    A schedule of the code is the code's in every column but ``enabled`` (the operator's
    switch, which a deploy never resets) and the bookkeeping ones (``next_run_at``,
    ``last_run_at``, ``last_job_id``, ``removed_at``); one of the admin is the operator's.
    Its cadence is ``cron`` (on the wall clock of ``timezone``) or ``every`` (an interval
    of whole seconds; ``timezone`` is then UTC), never both. ``next_run_at`` is the next
    tick, as an instant; the maintenance duty ``enqueue_due_periodic`` moves it forward
    with a compare-and-set when it enqueues. Written only through ``pgqueue.schedules``.
    """

    name = models.CharField(max_length=150, unique=True)
    cron = models.CharField(max_length=200, null=True, blank=True)
    every = models.DurationField(null=True, blank=True)
    timezone = models.CharField(max_length=64)
    task = models.CharField(max_length=200)
    tenant = models.CharField(max_length=NAME_MAX)
    queue = models.CharField(max_length=NAME_MAX)
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.IntegerField(default=5)
    payload = models.JSONField(null=True, blank=True)
    missed = models.CharField(max_length=16, choices=Missed.choices, default=Missed.RUN_ONCE)
    source = models.CharField(
        max_length=8, choices=Source.choices, default=Source.CODE, db_default=Source.CODE
    )
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
            models.CheckConstraint(
                condition=Q(source__in=["code", "admin"]), name="pgqueue_periodic_source"
            ),
            # A cron expression or an interval, never both, never neither.
            models.CheckConstraint(
                condition=Q(cron__isnull=False, every__isnull=True)
                | Q(cron__isnull=True, every__isnull=False, every__gt=dt.timedelta(0)),
                name="pgqueue_periodic_cron_or_every",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron if self.every is None else f'every {self.every}'})"
