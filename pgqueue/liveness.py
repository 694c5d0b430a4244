"""The read side's figures of the worker registry: who is alive, and what no live worker serves.

A worker is alive while it is seen within a lease (its heartbeat renews ``last_seen_at``);
these are the definitions the admin, the dashboard, ``/metrics`` and the command line share.
Reads of ``pgqueue_worker``, which maintenance prunes to a day of rows; part of the read side
(``pgqueue.reads``), apart so that each module holds one idea.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.models import (
    BooleanField,
    Count,
    ExpressionWrapper,
    F,
    Q,
)
from django.utils import timezone

from . import read_sql
from .conf import pgqueue_settings, queue_db
from .models import (
    Worker,
)


def lease_seconds() -> float:
    """How long a worker may stay silent and still count as alive: one that has not renewed
    its leases for that long has lost them anyway."""
    return float(pgqueue_settings.LEASE_SECONDS)


def alive_since(now: dt.datetime) -> dt.datetime:
    """A worker not stopped and seen at or after this moment is alive."""
    return now - dt.timedelta(seconds=lease_seconds())


def worker_state(
    stopped_at: dt.datetime | None, last_seen_at: dt.datetime, now: dt.datetime
) -> str:
    """ "stopped" (it said so), "alive" (seen within a lease) or "stale" (not stopped but
    silent longer, so its leases are lost or about to be)."""
    if stopped_at is not None:
        return "stopped"
    return "alive" if last_seen_at >= alive_since(now) else "stale"


def _alive(now: dt.datetime) -> Q:
    return Q(stopped_at__isnull=True, last_seen_at__gte=alive_since(now))


def workers_alive(now: dt.datetime | None = None, *, using: str | None = None) -> int:
    """How many workers are alive (see ``worker_state``). Reads pgqueue_worker."""
    return Worker.objects.using(queue_db(using)).filter(_alive(now or timezone.now())).count()


def workers_overview(now: dt.datetime, shown: int, *, using: str | None = None) -> dict[str, Any]:
    """Worker counts (alive, stale, stopped, total), the first ``shown`` workers, the alive
    ones first, each with its ``state``, and the ``lease_seconds`` that "alive" means.

    Two reads of pgqueue_worker, which maintenance prunes to the workers seen within a day
    (a few rows per worker process).
    """
    alive_q = _alive(now)
    table = Worker.objects.using(queue_db(using))
    counts = table.aggregate(
        alive=Count("id", filter=alive_q),
        stopped=Count("id", filter=Q(stopped_at__isnull=False)),
        total=Count("id"),
    )
    listed = (
        table.annotate(alive=ExpressionWrapper(alive_q, output_field=BooleanField()))
        .order_by("-alive", F("stopped_at").asc(nulls_first=True), "host", "pid", "id")
        .values("id", "host", "pid", "queues", "concurrency", "last_seen_at", "stopped_at")[:shown]
    )
    return {
        "alive": counts["alive"],
        "stale": counts["total"] - counts["alive"] - counts["stopped"],
        "stopped": counts["stopped"],
        "total": counts["total"],
        "rows": [
            {**w, "state": worker_state(w["stopped_at"], w["last_seen_at"], now)} for w in listed
        ],
        "lease_seconds": lease_seconds(),
    }


def unserved_queues(now: dt.datetime | None = None, *, using: str | None = None) -> list[str]:
    """The queues with queued jobs (runnable, or gated behind a limit) that no live worker
    serves (none alive lists them in its ``queues``), by name: their jobs wait however long
    the backlog looks.

    QUEUE_UNSERVED: two index probes per queue with queued jobs, and pgqueue_worker.
    """
    params = {"alive_since": alive_since(now or timezone.now())}
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.QUEUE_UNSERVED, params)
        return [queue for (queue,) in cursor.fetchall()]


def unserved_tasks(
    tasks: Iterable[str], now: dt.datetime | None = None, *, using: str | None = None
) -> set[str]:
    """Of ``tasks``, those no live worker has a handler for (none alive lists them in its
    ``tasks``): their jobs are given back by every worker that claims them, and wait.

    TASK_UNSERVED: pgqueue_worker, for the names asked for.
    """
    names = sorted(set(tasks))
    if not names:
        return set()
    params = {"tasks": names, "alive_since": alive_since(now or timezone.now())}
    with connections[queue_db(using)].cursor() as cursor:
        cursor.execute(read_sql.TASK_UNSERVED, params)
        return {task for (task,) in cursor.fetchall()}
