"""API keys (``Authorization: Bearer <key>``), permissions and rate limits.

Who may do what:
- an API key: its tenant's jobs (or every tenant's, for an all-tenants key); the views
  narrow what a tenant key sees and may act as;
- a session (the browsable API): an active staff user holding the Django model permission
  of the operation (``SESSION_PERMISSIONS``), as in the admin; superusers hold them all.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions, throttling

from .. import keys
from ..conf import pgqueue_settings
from ..models import ApiKey


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Bearer API keys. A request without one falls through to the session (staff users)."""

    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        failures = AuthFailureThrottle()
        wait = failures.wait_for(request)
        if wait is not None:  # over budget: refuse before the key costs a query
            raise exceptions.Throttled(
                wait, "too many failed authentications from this address; try again later"
            )
        key = key.strip()
        if not key:
            failures.record(request)
            raise exceptions.AuthenticationFailed("Authorization: Bearer needs an API key")
        row = keys.authenticate_api_key(key)
        if row is None:
            failures.record(request)
            raise exceptions.AuthenticationFailed("invalid or revoked API key")
        return (KeyUser(row), row)

    def authenticate_header(self, request: Any) -> str:
        return f'{self.keyword} realm="pgqueue"'


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes API keys."""

    target_class = ApiKeyAuthentication
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key from `manage.py pgqueue apikey create` or the admin.",
        }


class KeyUser:
    """The identity of a request made with an API key."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key
        self.pk = f"key:{key.prefix}"

    def __str__(self) -> str:
        return f"API key {self.key.prefix}"


class Scope:
    """Which tenants a request may see and act as, and what a key may enqueue.

    A key's ``tasks`` and ``queues`` (empty: no limit) narrow what PGQUEUE["API_TASKS"]
    and its tenant allow; ``max_priority`` is the highest priority it may set (a tenant
    key's default is PGQUEUE["TENANT_MAX_PRIORITY"], an all-tenants key's 100). A session
    has the limits of an all-tenants key without a scope.
    """

    def __init__(
        self,
        tenant: str | None,
        *,
        tasks: list[str] | None = None,
        queues: list[str] | None = None,
        max_priority: int | None = None,
    ) -> None:
        self.tenant = tenant  # None: every tenant
        self.tasks = list(tasks or [])
        self.queues = list(queues or [])
        if max_priority is None:
            max_priority = pgqueue_settings.TENANT_MAX_PRIORITY if tenant is not None else 100
        self.max_priority = max_priority

    @property
    def all_tenants(self) -> bool:
        return self.tenant is None

    def allows(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant

    def sees(self, job: Any) -> bool:
        """A job this scope may read, cancel and retry: one it could have enqueued. Its
        tenant's, of its tasks, in its queues, at most its priority; for a tenant key, also
        of a task PGQUEUE["API_TASKS"] opens to the API. (An all-tenants key is an
        operator's: API_TASKS bounds what it enqueues and retries, not what it reads.)"""
        return (
            self.allows(job.tenant_id)
            and (not self.queues or job.queue in self.queues)
            and (not self.tasks or job.task in self.tasks)
            and job.priority <= self.max_priority
            and (self.all_tenants or keys.api_may_enqueue(job.task, pgqueue_settings.API_TASKS))
        )

    def check_enqueue(self, task: str, queue: str, priority: int) -> None:
        """Refuse (403 naming the field) a job this scope may not enqueue, before any write.

        ``queue`` and ``priority`` are the job's effective ones (the task's or the
        settings' defaults filled in), so a default cannot be used to step outside.
        """
        if not keys.api_may_enqueue(task, pgqueue_settings.API_TASKS):
            _forbidden("task", f"the HTTP API may not enqueue {task!r} (PGQUEUE['API_TASKS'])")
        if self.tasks and task not in self.tasks:
            _forbidden("task", f"this API key may not enqueue {task!r}")
        if self.queues and queue not in self.queues:
            _forbidden("queue", f"this API key may not use queue {queue!r}")
        if priority > self.max_priority:
            _forbidden("priority", f"this API key may set priorities up to {self.max_priority}")


def _forbidden(field: str, reason: str) -> None:
    from .errors import ApiError, safe_text

    reason = safe_text(reason)
    raise ApiError(403, "forbidden", f"{field}: {reason}", {field: reason})


def scope_of(request: Any) -> Scope:
    key = request.auth if isinstance(request.auth, ApiKey) else None
    if key is None:
        return Scope(None)
    return Scope(key.tenant_id, tasks=key.tasks, queues=key.queues, max_priority=key.max_priority)


#: The Django model permission a session user needs, by URL name and method. HEAD and
#: OPTIONS need what GET needs; a method not listed needs the URL's first permission (so a
#: user who may read gets the 405 of a wrong method, and others a 403).
SESSION_PERMISSIONS: dict[str, dict[str, str]] = {
    "jobs": {"GET": "pgqueue.view_job", "POST": "pgqueue.add_job"},
    "jobs-batch": {"POST": "pgqueue.add_job"},
    "job": {"GET": "pgqueue.view_job", "DELETE": "pgqueue.change_job"},
    "job-retry": {"POST": "pgqueue.change_job"},
    "tenants": {"GET": "pgqueue.view_tenant"},
    "tenant": {"GET": "pgqueue.view_tenant", "PUT": "pgqueue.change_tenant"},
    "workflows": {"GET": "pgqueue.view_job", "POST": "pgqueue.add_job"},
    "workflow": {"GET": "pgqueue.view_job", "DELETE": "pgqueue.change_job"},
    "stats": {"GET": "pgqueue.view_job"},
    "metrics": {"GET": "pgqueue.view_job"},
}


def session_permission(request: Any) -> str | None:
    """The permission this request needs from a session user; None: only a superuser."""
    match = getattr(request, "resolver_match", None)
    perms = SESSION_PERMISSIONS.get(match.url_name if match is not None else "")
    if not perms:
        return None
    method = "GET" if request.method in ("HEAD", "OPTIONS") else request.method
    return perms.get(method, next(iter(perms.values())))


class HasAccess(permissions.BasePermission):
    """An API key, or a staff session holding the operation's model permission."""

    message = "an API key (Authorization: Bearer) or a staff session is required"

    def has_permission(self, request: Any, view: Any) -> bool:
        if isinstance(request.auth, ApiKey):
            return True
        user = getattr(request, "user", None)
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            return False
        if user.is_superuser:
            return True
        perm = session_permission(request)
        if perm is None or not user.has_perm(perm):
            self.message = f"this needs the {perm or 'superuser'} permission"
            return False
        return True


class AllTenants(HasAccess):
    """Operator endpoints: an all-tenants key or a staff session."""

    message = "this needs an all-tenants API key or a staff session"

    def has_permission(self, request: Any, view: Any) -> bool:
        return super().has_permission(request, view) and scope_of(request).all_tenants


class MetricsAccess(AllTenants):
    """/metrics and /stats: operators only, unless PGQUEUE["METRICS_PUBLIC"] is set."""

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(pgqueue_settings.METRICS_PUBLIC) or super().has_permission(request, view)


def client_address(request: Any) -> str:
    """The address a request came from: the connection's, or, behind
    PGQUEUE["API_TRUSTED_PROXIES"] proxies, the one the outermost of them saw (that many
    entries from the right of X-Forwarded-For). A client writes X-Forwarded-For as it
    likes: trusted blindly (as DRF's ``get_ident`` does without NUM_PROXIES), it would let
    an attacker spend a victim's budget of failed authentications, or evade its own."""
    remote = request.META.get("REMOTE_ADDR", "")
    proxies = int(pgqueue_settings.API_TRUSTED_PROXIES)
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "") if proxies > 0 else ""
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    return hops[-min(proxies, len(hops))] if hops else remote


class KeyRateThrottle(throttling.SimpleRateThrottle):
    """Per-key (or per-user, or per-address) rate limit, off unless API_RATE_LIMIT is set.

    The counts live in Django's cache: with several server processes, configure a shared
    cache (Redis, Memcached or the database cache) or each process counts on its own.
    """

    scope = "pgqueue"

    def get_rate(self) -> str | None:
        return pgqueue_settings.API_RATE_LIMIT

    def allow_request(self, request: Any, view: Any) -> bool:
        self.rate = self.get_rate()
        if not self.rate:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str:
        if isinstance(request.auth, ApiKey):
            ident = f"key:{request.auth.prefix}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"addr:{client_address(request)}"
        return f"pgqueue-throttle:{ident}"


class AuthFailureThrottle(throttling.SimpleRateThrottle):
    """Failed API-key authentications per client address (PGQUEUE["AUTH_FAILURE_RATE"]).

    Only failures count, so a guesser's budget is spent and a working client's is not; once
    an address is over it, its Bearer requests are refused before any key is looked up, so
    guessing costs the attacker time and the database nothing. The address is
    ``client_address``'s: the connection's unless PGQUEUE["API_TRUSTED_PROXIES"] says
    proxies stand in front. Like DRF's throttles, the history lives in Django's cache:
    share it between processes.
    """

    scope = "pgqueue-auth-failure"

    def get_rate(self) -> str | None:
        return pgqueue_settings.AUTH_FAILURE_RATE

    def get_cache_key(self, request: Any, view: Any) -> str:
        return f"pgqueue-auth-failures:{client_address(request)}"

    def _history(self, request: Any) -> list[float] | None:
        """The failures still inside the window, or None when the throttle is off."""
        if not self.rate:
            return None
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self.key = self.get_cache_key(request, None)
        self.now = self.timer()
        history = self.cache.get(self.key, [])
        self.history = [t for t in history if t > self.now - self.duration]
        return self.history

    def wait_for(self, request: Any) -> float | None:
        """Seconds the address must wait before its next attempt, or None if it may try."""
        history = self._history(request)
        if history is None or len(history) < self.num_requests:
            return None
        return max(1.0, self.duration - (self.now - history[-1]))

    def record(self, request: Any) -> None:
        history = self._history(request)
        if history is not None:
            self.cache.set(self.key, [self.now, *history], self.duration)
