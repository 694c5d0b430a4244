"""Concurrency keys: at most N jobs of one key (``Job.concurrency_key``, e.g. ``"user:42"``)
hold a slot at once, across every worker and host; N = 1 is a sequence.

Kept apart from ``models`` (imported at its end, so Django registers it with the app). The
statements are in ``pgqueue/queries/keys.sql``; docs/explanation/architecture.md,
"Concurrency keys", has the design.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

#: The longest concurrency key, and the bounds of a key's cap (``key_max_running``).
KEY_MAX_LENGTH = 128
KEY_MAX_RUNNING_BOUND = 10_000


class KeyState(models.TextChoices):
    """Where a job with a concurrency key stands with its key (``Job.key_state``)."""

    NONE = "", "none held (its slot given back)"
    NEW = "new", "not yet examined: waits for admission"
    WAITING = "waiting", "waiting for a slot of its key"
    HELD = "held", "holding a slot of its key"


class ConcurrencyKey(models.Model):
    """A key with jobs holding its slots: ``running`` of them (queued to run, running, or
    waiting out a retry's backoff; a dead one too with ``DEAD_JOB_HOLDS_KEY``).

    A row exists only while ``running`` > 0: KEY_SETTLE creates it for a key's first
    admitted job and deletes it when the last slot is given back, so an idle key costs
    nothing. ``running`` changes only under the row's lock.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=KEY_MAX_LENGTH)
    running = models.IntegerField()

    class Meta:
        db_table = "pgqueue_key"
        constraints = [
            # KEY_SETTLE's lookups and its ON CONFLICT (a unique constraint, not a unique
            # field: Django would add a second, pattern-matching index to a unique field).
            models.UniqueConstraint(fields=["key"], name="pgqueue_key_uniq"),
            models.CheckConstraint(condition=Q(running__gt=0), name="pgqueue_key_running"),
        ]

    def __str__(self) -> str:
        return f"key {self.key}: {self.running} held"
