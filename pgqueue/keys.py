"""API keys of the HTTP API: created, revoked and checked here, and nowhere else.

A key is shown once, at creation; only its SHA-256 is stored, found by the short prefix the
key carries, so a stolen database dump holds no usable key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets

from django.db import transaction
from django.utils import timezone

from .models import ApiKey, Tenant
from .services import validate_name

API_KEY_PREFIX = "pgq_"

#: A key's last use is written at most this often, not on every request.
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)


def _hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_api_key(
    *, tenant: str | None = None, name: str = "", using: str = "default"
) -> tuple[ApiKey, str]:
    """Create an API key bound to ``tenant`` (created if new), or to all tenants when None.

    Returns the key's row and the key itself, which is not stored and cannot be shown again.
    """
    if tenant is not None:
        tenant = validate_name(tenant, "tenant")
    prefix = secrets.token_hex(4)
    key = f"{API_KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic(using=using):
        if tenant is not None:
            Tenant.objects.using(using).get_or_create(name=tenant)
        row = ApiKey.objects.using(using).create(
            prefix=prefix, key_hash=_hash_key(key), tenant_id=tenant, name=name
        )
    return row, key


def revoke_api_key(prefix: str, *, using: str = "default") -> ApiKey:
    """Revoke a key by its prefix; raises ApiKey.DoesNotExist for an unknown prefix."""
    row = ApiKey.objects.using(using).get(prefix=prefix)
    if row.revoked_at is None:
        row.revoked_at = timezone.now()
        row.save(update_fields=["revoked_at"])
    return row


def authenticate_api_key(key: str, *, using: str = "default") -> ApiKey | None:
    """The active key row for ``key``, or None. Constant-time comparison of the hash."""
    parts = key.split("_")
    if len(parts) < 3 or not key.startswith(API_KEY_PREFIX):
        return None
    row = ApiKey.objects.using(using).filter(prefix=parts[1], revoked_at__isnull=True).first()
    if row is None or not hmac.compare_digest(row.key_hash, _hash_key(key)):
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.using(using).filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row
