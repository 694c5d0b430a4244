"""API keys (``Authorization: Bearer <key>``), permissions and per-key rate limits."""

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
        key = key.strip()
        if not key:
            raise exceptions.AuthenticationFailed("Authorization: Bearer needs an API key")
        row = keys.authenticate_api_key(key)
        if row is None:
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
            "description": "An API key from `manage.py pgqueue_apikey create` or the admin.",
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
    """Which tenants a request may see and act as."""

    def __init__(self, tenant: str | None) -> None:
        self.tenant = tenant  # None: every tenant

    @property
    def all_tenants(self) -> bool:
        return self.tenant is None

    def allows(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


def scope_of(request: Any) -> Scope:
    key = request.auth if isinstance(request.auth, ApiKey) else None
    return Scope(key.tenant_id if key is not None else None)


class HasAccess(permissions.BasePermission):
    """An API key, or a logged-in staff user (the browsable API)."""

    message = "an API key (Authorization: Bearer) or a staff session is required"

    def has_permission(self, request: Any, view: Any) -> bool:
        if isinstance(request.auth, ApiKey):
            return True
        user = getattr(request, "user", None)
        return bool(user and user.is_authenticated and user.is_staff)


class AllTenants(HasAccess):
    """Operator endpoints: an all-tenants key or a staff session."""

    message = "this needs an all-tenants API key or a staff session"

    def has_permission(self, request: Any, view: Any) -> bool:
        return super().has_permission(request, view) and scope_of(request).all_tenants


class MetricsAccess(AllTenants):
    """/metrics and /stats: operators only, unless PGQUEUE["METRICS_PUBLIC"] is set."""

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(pgqueue_settings.METRICS_PUBLIC) or super().has_permission(request, view)


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
            ident = f"addr:{self.get_ident(request)}"
        return f"pgqueue-throttle:{ident}"
