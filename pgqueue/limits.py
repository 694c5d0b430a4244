"""Concurrency caps, rate limits and pause, for queues, tenants and (queue, tenant) pairs.

The services the Python API, the HTTP API and the admin call to change limits. A scope is
a queue (every tenant's jobs there), a tenant (its jobs in every queue) or a tenant in one
queue; every scope that applies to a job holds at once, so a (queue, tenant) limit narrows
the tenant's in that queue and never lifts it. See docs/explanation/architecture.md for the design:
jobs of a limited tenant wait "gated", outside the claim index, and the claim counts the
jobs it starts in their limit rows under the rows' locks, which is what makes a cap exact.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import connections, transaction

from . import limits_store
from .conf import pgqueue_settings, queue_db
from .exceptions import InvalidJob
from .limit_models import MAX_RUNNING_BOUND, RATE_COUNT_BOUND, RATE_PERIODS
from .limits_store import UNSET
from .services import validate_name

_RATE_RE = re.compile(r"^([1-9][0-9]{0,6})/(s|sec|second|m|min|minute|h|hour)\Z")

__all__ = [
    "UNSET",
    "parse_rate",
    "pause_queue",
    "pause_tenant",
    "resume_queue",
    "resume_tenant",
    "set_limits",
    "set_queue_limits",
    "set_tenant_limits",
    "validate_max_running",
]


def validate_max_running(value: Any) -> int | None:
    """An integer from 1 to MAX_RUNNING_BOUND, or None for no cap."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(
            "max_running", f"must be an integer from 1 to {MAX_RUNNING_BOUND:,} or null"
        )
    if not 1 <= value <= MAX_RUNNING_BOUND:
        raise InvalidJob("max_running", f"must be from 1 to {MAX_RUNNING_BOUND:,}, got {value}")
    return value


def parse_rate(value: Any) -> tuple[int, int] | None:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (DRF's throttle-rate form; ``sec``, ``min``,
    ``hour`` and the full words too) as ``(N, seconds)``; None for no rate limit."""
    if value is None:
        return None
    match = _RATE_RE.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) > RATE_COUNT_BOUND:
        raise InvalidJob(
            "rate_limit",
            f'must be "N/s", "N/m" or "N/h" with N from 1 to {RATE_COUNT_BOUND:,}, or null; '
            f"got {value!r}",
        )
    return int(match.group(1)), RATE_PERIODS[match.group(2)[0]]


def set_limits(
    *,
    queue: str | None = None,
    tenant: str | None = None,
    max_running: Any = UNSET,
    rate_limit: Any = UNSET,
    paused: bool | None = None,
    using: str | None = None,
) -> None:
    """Set the limits of one scope; a field left UNSET (or ``paused`` None) is kept.

    Takes effect at the next claim. A cap lowered below what runs now starts nothing new
    until the scope is below it; running jobs are never stopped. When a tenant scope
    starts or stops limiting anything, its queued jobs are gated or ungated, in batches of
    LIMITS_GATE_BATCH, each its own transaction after the first (the claim counts a job in
    its limits whether it is gated yet or not). Workers are woken.
    """
    queue = "" if queue is None else validate_name(queue, "queue")
    tenant = "" if tenant is None else validate_name(tenant, "tenant")
    if not queue and not tenant:
        raise InvalidJob("queue", "give a queue, a tenant or both")
    if max_running is not UNSET:
        max_running = validate_max_running(max_running)
    rate = UNSET if rate_limit is UNSET else parse_rate(rate_limit)
    batch = int(pgqueue_settings.LIMITS_GATE_BATCH)
    using = queue_db(using)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        _, limiting = limits_store.set_limit(
            cursor,
            queue=queue,
            tenant=tenant,
            max_running=max_running,
            rate=rate,
            paused=paused,
        )
        changed = 0
        if tenant:
            changed = limits_store.regate(
                cursor, tenant=tenant, queue=queue, gate=limiting, limit=batch
            )
        limits_store.notify(cursor, queue=queue)
    while changed >= batch:  # the rest in batches, each its own transaction
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            changed = limits_store.regate(
                cursor, tenant=tenant, queue=queue, gate=limiting, limit=batch
            )


def set_tenant_limits(
    tenant: str,
    *,
    queue: str | None = None,
    max_running: Any = UNSET,
    rate_limit: Any = UNSET,
    using: str | None = None,
) -> None:
    """A tenant's cap and rate limit in every queue, or with ``queue`` in that queue (on
    top of the tenant's own). None removes one; UNSET keeps it."""
    set_limits(
        tenant=tenant, queue=queue, max_running=max_running, rate_limit=rate_limit, using=using
    )


def set_queue_limits(
    queue: str, *, max_running: Any = UNSET, rate_limit: Any = UNSET, using: str | None = None
) -> None:
    """A queue's global cap and rate limit (every tenant's jobs there together)."""
    set_limits(queue=queue, max_running=max_running, rate_limit=rate_limit, using=using)


def pause_queue(queue: str, *, using: str | None = None) -> None:
    """No job of ``queue`` starts until ``resume_queue``; jobs keep arriving and wait,
    running ones finish."""
    set_limits(queue=queue, paused=True, using=using)


def resume_queue(queue: str, *, using: str | None = None) -> None:
    set_limits(queue=queue, paused=False, using=using)


def pause_tenant(tenant: str, *, queue: str | None = None, using: str | None = None) -> None:
    """No job of ``tenant`` (in ``queue``, or anywhere) starts until ``resume_tenant``."""
    set_limits(tenant=tenant, queue=queue, paused=True, using=using)


def resume_tenant(tenant: str, *, queue: str | None = None, using: str | None = None) -> None:
    set_limits(tenant=tenant, queue=queue, paused=False, using=using)
