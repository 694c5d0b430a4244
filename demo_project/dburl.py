"""DATABASE_URL → Django's DATABASES entry (postgresql://user:pass@host:port/name?opts)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def parse(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got {parts.scheme!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    # A Unix socket directory may come as ?host=/path (libpq's URI form).
    host = query.pop("host", None) or unquote(parts.hostname or "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": query,
        # Keep connections between requests (a new PostgreSQL backend costs milliseconds);
        # health checks replace one that died while idle.
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }
