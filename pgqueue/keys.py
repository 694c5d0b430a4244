"""API keys of the HTTP API: created, revoked and checked here, and nowhere else.

A key is shown once, at creation; only its SHA-256 is stored, found by the short prefix the
key carries, so a stolen database dump holds no usable key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .conf import queue_db
from .exceptions import InvalidJob
from .models import ApiKey, Tenant
from .registry import TASK_NAME_RE, registered_tasks
from .services import validate_name, validate_priority

API_KEY_PREFIX = "pgq_"

#: A key's last use is written at most this often, not on every request.
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


def _hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


#: The family of Django Tasks jobs ("django.tasks" and "django.tasks:<path>"): a wildcard of
#: API_TASKS never matches it, and no default opens it, because its name is a module path.
DJANGO_TASKS_FAMILY = "django.tasks"


def _django_task_name(name: str) -> bool:
    return name == DJANGO_TASKS_FAMILY or name.startswith(f"{DJANGO_TASKS_FAMILY}:")


def api_tasks_problem(value: Any) -> str | None:
    """What is wrong with a PGQUEUE["API_TASKS"] value, or None (for the system check)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        return "must be None or a list of task names"
    for entry in value:
        if not isinstance(entry, str):
            return "must hold only strings"
        head = entry[:-1] if entry.endswith("*") else entry
        if head and not TASK_NAME_RE.match(head.rstrip(".:")):
            return f"holds {entry!r}, neither a task name nor a prefix ending in '*'"
    return None


def api_may_enqueue(task: str, allowed: Any) -> bool:
    """Whether the HTTP API may enqueue ``task`` under API_TASKS ``allowed``.

    None: every @pgqueue.task. A Django Task (``django.tasks:<path>``) only if listed by its
    full name: its name is a module path, so a tenant who could pick it would pick code.
    """
    if allowed is None:
        return not _django_task_name(task) and task in registered_tasks()
    if task in allowed:
        return True
    if _django_task_name(task):
        return False
    return any(e.endswith("*") and task.startswith(e[:-1]) for e in allowed)


def api_tasks_q(allowed: Any) -> Q:
    """``api_may_enqueue`` as a filter on jobs' ``task`` (a list of a tenant key's jobs
    shows only what it could read one by one)."""
    if allowed is None:
        return Q(task__in=[t for t in registered_tasks() if not _django_task_name(t)])
    wanted = Q(task__in=list(allowed))
    for entry in allowed:
        if entry.endswith("*"):
            wanted |= Q(task__startswith=entry[:-1]) & ~(
                Q(task=DJANGO_TASKS_FAMILY) | Q(task__startswith=f"{DJANGO_TASKS_FAMILY}:")
            )
    return wanted


def _names(values: Any, field: str) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str) or not isinstance(values, list | tuple):
        raise InvalidJob(field, "must be a list of names")
    if field == "tasks":
        for value in values:
            if not isinstance(value, str) or not TASK_NAME_RE.match(value):
                raise InvalidJob(field, f"{value!r} is not a valid task name")
        return list(values)
    return [validate_name(value, field) for value in values]


def validate_scope(
    *, tasks: Any = None, queues: Any = None, max_priority: Any = None
) -> tuple[list[str], list[str], int | None]:
    """A key's scope, checked: task names, queue names, a priority or None."""
    if max_priority is not None:
        max_priority = validate_priority(max_priority)
    return _names(tasks, "tasks"), _names(queues, "queues"), max_priority


def set_api_key_scope(
    prefix: str,
    *,
    tasks: list[str] | None = None,
    queues: list[str] | None = None,
    max_priority: int | None = None,
    using: str | None = None,
) -> ApiKey:
    """Narrow or widen a key's scope; its tenant and secret stay as they are."""
    tasks, queues, max_priority = validate_scope(
        tasks=tasks, queues=queues, max_priority=max_priority
    )
    row = ApiKey.objects.using(queue_db(using)).get(prefix=prefix)
    row.tasks, row.queues, row.max_priority = tasks, queues, max_priority
    row.save(update_fields=["tasks", "queues", "max_priority"])
    return row


def create_api_key(
    *,
    tenant: str | None = None,
    name: str = "",
    tasks: list[str] | None = None,
    queues: list[str] | None = None,
    max_priority: int | None = None,
    using: str | None = None,
) -> tuple[ApiKey, str]:
    """Create an API key bound to ``tenant`` (created if new), or to all tenants when None,
    optionally narrowed to some tasks, queues and a highest priority.

    Returns the key's row and the key itself, which is not stored and cannot be shown again.
    """
    if tenant is not None:
        tenant = validate_name(tenant, "tenant")
    tasks, queues, max_priority = validate_scope(
        tasks=tasks, queues=queues, max_priority=max_priority
    )
    prefix = secrets.token_hex(4)
    key = f"{API_KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic(using=queue_db(using)):
        if tenant is not None:
            Tenant.objects.using(queue_db(using)).get_or_create(name=tenant)
        row = ApiKey.objects.using(queue_db(using)).create(
            prefix=prefix,
            key_hash=_hash_key(key),
            tenant_id=tenant,
            name=name,
            tasks=tasks,
            queues=queues,
            max_priority=max_priority,
        )
    return row, key


def revoke_api_key(prefix: str, *, using: str | None = None) -> ApiKey:
    """Revoke a key by its prefix; raises ApiKey.DoesNotExist for an unknown prefix."""
    row = ApiKey.objects.using(queue_db(using)).get(prefix=prefix)
    if row.revoked_at is None:
        row.revoked_at = timezone.now()
        row.save(update_fields=["revoked_at"])
    return row


def authenticate_api_key(key: str, *, using: str | None = None) -> ApiKey | None:
    """The active key row for ``key``, or None. Constant-time comparison of the hash."""
    parts = key.split("_")
    if len(parts) < 3 or not key.startswith(API_KEY_PREFIX):
        return None
    row = (
        ApiKey.objects.using(queue_db(using))
        .filter(prefix=parts[1], revoked_at__isnull=True)
        .first()
    )
    if row is None or not hmac.compare_digest(row.key_hash, _hash_key(key)):
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.using(queue_db(using)).filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row
