"""System checks: the database pgqueue needs, and valid PGQUEUE settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import load_backend

from .conf import DEFAULTS, pgqueue_settings
from .fairness import ORDERINGS

MIN_POSTGRES = 140000


def database_vendor(alias: str = DEFAULT_DB_ALIAS) -> str:
    """The vendor of DATABASES[alias], read from its ENGINE without connecting.

    Read from the settings rather than from ``connections`` so that the answer is known
    before any connection exists (plain ``manage.py check``, ``runserver``) and follows
    ``override_settings``; the backend's own ``vendor`` also covers engines that subclass
    PostgreSQL's (PostGIS, instrumented backends).
    """
    engine = settings.DATABASES[alias].get("ENGINE", "")
    if not engine:
        return "unconfigured"
    return load_backend(engine).DatabaseWrapper.vendor


def _not_postgresql(alias: str) -> str | None:
    """Why pgqueue cannot run on DATABASES[alias], or None when its vendor is PostgreSQL."""
    if alias not in settings.DATABASES:
        return None  # Django reports a missing default alias itself
    vendor = database_vendor(alias)
    if vendor == "postgresql":
        return None
    engine = settings.DATABASES[alias].get("ENGINE", "")
    return (
        f"pgqueue needs PostgreSQL 14 or newer, but DATABASES[{alias!r}] uses {vendor} "
        f"({engine or 'no ENGINE'})."
    )


def require_postgresql(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Stop a command that cannot work on this database, in one line, before it connects.

    ``runworker`` calls it first: on SQLite the worker would otherwise die deep inside
    psycopg-specific code with a message that names neither pgqueue nor PostgreSQL.
    """
    problem = _not_postgresql(alias)
    if problem:
        raise CommandError(problem)


@register()
def check_database_engine(app_configs: Any = None, **kwargs: Any) -> list:
    """pgqueue relies on SKIP LOCKED, LISTEN/NOTIFY and advisory locks: PostgreSQL.

    Not a database check, so that it runs at plain ``manage.py check`` and ``runserver``
    (Django runs database checks only for ``migrate`` and ``check --database``). It looks at
    the alias pgqueue uses, the default one.
    """
    problem = _not_postgresql(DEFAULT_DB_ALIAS)
    if problem is None:
        return []
    return [
        Error(
            problem,
            hint="Point DATABASES at PostgreSQL 14 or newer "
            "(ENGINE 'django.db.backends.postgresql').",
            id="pgqueue.E001",
        )
    ]


@register(Tags.database)
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """The PostgreSQL server is 14 or newer (this needs a connection: a database check).

    Aliases of another vendor are left to ``check_database_engine``, which reports the one
    pgqueue uses; a project's other databases may be anything.
    """
    errors: list = []
    for alias in databases or []:
        conn = connections[alias]
        if conn.vendor != "postgresql":
            continue
        conn.ensure_connection()
        if conn.pg_version < MIN_POSTGRES:
            major, minor = divmod(conn.pg_version, 10000)
            errors.append(
                Error(
                    f"pgqueue needs PostgreSQL 14 or newer; DATABASES[{alias!r}] runs "
                    f"{major}.{minor}.",
                    hint="Upgrade the PostgreSQL server to 14 or newer.",
                    id="pgqueue.E002",
                )
            )
    return errors


def _number(name: str, value: Any, *, minimum: float, integer: bool = False) -> str | None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < minimum:
        what = "an integer" if integer else "a number"
        return f"PGQUEUE[{name!r}] must be {what} >= {minimum}, got {value!r}."
    return None


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list:
    """Every PGQUEUE setting is known and has a usable value."""
    s = pgqueue_settings
    problems: list[str] = []
    unknown = sorted(set(s.user_settings) - set(DEFAULTS))
    if unknown:
        problems.append(
            f"Unknown PGQUEUE setting(s): {', '.join(unknown)}. "
            f"Known settings: {', '.join(sorted(DEFAULTS))}."
        )
    for name, minimum, integer in [
        ("LEASE_SECONDS", 1, False),
        ("BACKOFF_BASE", 0, False),
        ("BACKOFF_CAP", 0, False),
        ("POLL_SECONDS", 0.01, False),
        ("MAINTENANCE_SECONDS", 0.01, False),
        ("BATCH_SIZE", 1, True),
        ("MAINTENANCE_BATCH_SIZE", 1, True),
        ("MAX_PAYLOAD_BYTES", 2, True),
        ("MAX_RESULT_BYTES", 2, True),
        ("CONNECT_ATTEMPTS", 1, True),
    ]:
        problem = _number(name, getattr(s, name), minimum=minimum, integer=integer)
        if problem:
            problems.append(problem)
    if s.HEARTBEAT_SECONDS is not None:
        problem = _number("HEARTBEAT_SECONDS", s.HEARTBEAT_SECONDS, minimum=0.01)
        if problem:
            problems.append(problem)
        elif s.HEARTBEAT_SECONDS >= s.LEASE_SECONDS:
            problems.append(
                "PGQUEUE['HEARTBEAT_SECONDS'] must be shorter than PGQUEUE['LEASE_SECONDS'], "
                "or leases expire between heartbeats."
            )
    dma = s.DEFAULT_MAX_ATTEMPTS
    if isinstance(dma, bool) or not isinstance(dma, int) or not 1 <= dma <= 100:
        problems.append(f"PGQUEUE['DEFAULT_MAX_ATTEMPTS'] must be an integer 1..100, got {dma!r}.")
    if s.ORDERING not in ORDERINGS:
        problems.append(f"PGQUEUE['ORDERING'] must be one of {ORDERINGS}, got {s.ORDERING!r}.")
    for name in ("DEFAULT_QUEUE", "DEFAULT_TENANT", "NOTIFY_CHANNEL"):
        value = getattr(s, name)
        if not isinstance(value, str) or not value or len(value) > 63:
            problems.append(f"PGQUEUE[{name!r}] must be a non-empty string, got {value!r}.")
    modules = s.TASK_MODULES
    if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
        problems.append(f"PGQUEUE['TASK_MODULES'] must be a list of module names, got {modules!r}.")
    for name, minimum in (("COUNT_CAP", 1), ("API_PAGE_BYTES", 1024), ("API_FIELD_BYTES", 64)):
        problem = _number(name, getattr(s, name), minimum=minimum, integer=True)
        if problem:
            problems.append(problem)
    return [
        Error(
            p,
            hint="Fix settings.PGQUEUE; see the configuration table in the README.",
            id="pgqueue.E003",
        )
        for p in problems
    ]
