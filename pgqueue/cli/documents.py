"""What ``--json`` prints for a job, an attempt, a tenant and a queue: the documents the
HTTP API answers with, built without Django REST framework.

The operator commands are part of pgqueue's core, which installs without the ``api`` extra
(DRF and drf-spectacular), so they cannot use the API's serializers
(pgqueue/api/serializers.py). These functions write the same fields with the same values, as
the serializers' fields render them: an integer as an int, a float as a float, a datetime in
ISO 8601 in the current time zone with ``Z`` for UTC. tests/test_cli_documents.py holds
each one equal to its serializer's output, so the two cannot drift apart.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.utils import timezone

from ..models import JOB_FIELDS, Job, JobAttempt, Status

_JOB_DATETIMES = frozenset(
    {"run_at", "created_at", "claimed_at", "started_at", "finished_at", "cancel_requested_at"}
)
_JOB_INTS = frozenset({"id", "priority", "attempts", "max_attempts", "lost_claims"})
#: The foreign keys among the fields, written as their column: the id, or null.
_JOB_KEYS = {"tenant": "tenant_id", "workflow": "workflow_id"}


def moment(value: dt.datetime | None) -> str | None:
    """A datetime as DRF's DateTimeField writes it: ISO 8601 in the current time zone (with
    USE_TZ), ``Z`` for UTC; None stays None."""
    if not value:
        return None
    if settings.USE_TZ and timezone.is_aware(value):
        value = value.astimezone(timezone.get_current_timezone())
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _optional(convert: Any, value: Any) -> Any:
    return None if value is None else convert(value)


def job(job: Job) -> dict[str, Any]:
    """A job as GET /jobs/<id> shows it, without its history: a running job whose
    cancellation was requested is "cancelling"."""
    document: dict[str, Any] = {}
    for name in JOB_FIELDS:
        # A foreign key as its column, never its row (as the serializer writes it).
        value = getattr(job, _JOB_KEYS.get(name, name))
        if name in _JOB_DATETIMES:
            value = moment(value)
        elif name in _JOB_INTS:
            value = int(value)
        elif name in ("key_max_running", "workflow"):
            value = _optional(int, value)
        elif name == "timeout_seconds":
            value = _optional(float, value)
        elif name not in ("payload", "result", "progress", "output"):  # JSON, as it is
            value = _optional(str, value)
        document[name] = value
    if document["status"] == Status.RUNNING and job.cancel_requested_at is not None:
        document["status"] = "cancelling"
    return document


def attempt(attempt: JobAttempt) -> dict[str, Any]:
    """One entry of a job's ``history``."""
    return {
        "attempt": int(attempt.attempt),
        "worker": str(attempt.worker),
        "claimed_at": moment(attempt.claimed_at),
        "started_at": moment(attempt.started_at),
        "finished_at": moment(attempt.finished_at),
        "outcome": str(attempt.outcome),
        "error": _optional(str, attempt.error),
        "traceback": _optional(str, attempt.traceback),
    }


def tenant(summary: dict[str, Any]) -> dict[str, Any]:
    """A tenant as GET /tenants/<name> shows it, from ``reads.tenant_summaries``' row (a
    count that stopped at its bound is the number of rows counted, as the API writes it)."""
    return {
        "name": str(summary["name"]),
        "weight": float(summary["weight"]),
        "queue_weights": {str(q): _optional(float, w) for q, w in summary["queue_weights"].items()},
        "backlog": int(summary["backlog"]),
        "running": int(summary["running"]),
        "done": int(summary["done"]),
        "dead": int(summary["dead"]),
        "capped": [_optional(str, name) for name in summary["capped"]],
        "created_at": moment(summary["created_at"]),
        "max_running": _optional(int, summary.get("max_running")),
        "rate_limit": _optional(str, summary.get("rate_limit")),
        "paused": bool(summary["paused"]),
        "queue_limits": {
            str(q): _optional(lambda limits: {str(k): v for k, v in limits.items()}, limits)
            for q, limits in summary["queue_limits"].items()
        },
    }


def queue(summary: dict[str, Any]) -> dict[str, Any]:
    """A queue as GET /queues/<name> shows it, from ``limit_reads.queue_summaries``' row."""
    return {
        "name": str(summary["name"]),
        "max_running": _optional(int, summary.get("max_running")),
        "rate_limit": _optional(str, summary.get("rate_limit")),
        "paused": bool(summary["paused"]),
        "running": int(summary["running"]),
    }
