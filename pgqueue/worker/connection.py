"""Dedicated psycopg connections for the worker, built from Django's DATABASES entry.

The worker does not use Django's connection for its own bookkeeping: LISTEN needs a
session of its own, and the claim/record loop must not share a connection (or its
transaction state) with handlers that use the ORM on other threads.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections

# Django-specific keys of get_connection_params() that psycopg.connect does not take, or
# that the worker sets itself (it uses server-side binding and prepared statements).
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")


def connect_params(alias: str = "default", application_name: str = "pgqueue") -> dict[str, Any]:
    params = connections[alias].get_connection_params()
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    params.setdefault("application_name", application_name)
    return params


def connect(params: dict[str, Any], *, autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(**params, autocommit=autocommit, connect_timeout=10)
