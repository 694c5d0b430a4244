"""System checks: the database pgqueue needs, and valid PGQUEUE settings."""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from importlib import import_module
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import load_backend

from .conf import DEFAULTS, FINISHED_STATUSES, pgqueue_settings
from .fairness import FAIRNESS_MODES, ORDERINGS
from .key_models import KEY_MAX_RUNNING_BOUND

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
    the alias pgqueue uses, ``PGQUEUE["DATABASE"]``.
    """
    problem = _not_postgresql(str(pgqueue_settings.DATABASE))
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


@register()
def check_queue_database(app_configs: Any = None, **kwargs: Any) -> list:
    """``PGQUEUE["DATABASE"]`` names a DATABASES alias, and pgqueue's models are routed to it.

    pgqueue passes the alias itself wherever it queries, but ``migrate``, the admin and a
    project's own ``Job.objects`` follow DATABASE_ROUTERS: without a router that sends
    pgqueue's models there, migrate would create the tables on the wrong database and
    the admin would read them from it.
    """
    alias = pgqueue_settings.DATABASE
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return [
            Error(
                f"PGQUEUE['DATABASE'] is {alias!r}, which is not a key of DATABASES "
                f"({', '.join(map(repr, settings.DATABASES))}).",
                hint="Name the alias that holds pgqueue's tables (default: 'default').",
                id="pgqueue.E030",
            )
        ]
    from django.db import router

    from .models import Job

    routed = {router.db_for_read(Job), router.db_for_write(Job)}
    if alias == DEFAULT_DB_ALIAS and routed == {DEFAULT_DB_ALIAS}:
        return []
    if routed == {alias} and router.allow_migrate_model(alias, Job):
        return []
    return [
        Error(
            f"PGQUEUE['DATABASE'] is {alias!r}, but DATABASE_ROUTERS send pgqueue's models "
            f"to {' and '.join(sorted(map(repr, routed)))}.",
            hint="Add 'pgqueue.router.QueueRouter' to DATABASE_ROUTERS (before routers "
            "that route every model), so that migrate, the admin and the ORM agree.",
            id="pgqueue.E031",
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


RATE_RE = re.compile(r"^[1-9][0-9]{0,8}/(s|sec|second|m|min|minute|h|hour|d|day)\Z")


def _rate(name: str, value: Any) -> str | None:
    """A throttle rate in DRF's form ("100/s", "20/min"), or None for no limit."""
    if value is None or (isinstance(value, str) and RATE_RE.match(value)):
        return None
    return (
        f"PGQUEUE[{name!r}] must be None or a rate such as '100/s', '20/min' or '1000/h', "
        f"got {value!r}."
    )


#: Settings pgqueue no longer reads, with why: a warning, not an error, so an upgrade
#: does not stop a project that still sets one.
RETIRED = {
    "LIMITS_CLAIM_SECONDS": "every claim counts what the limits apply to now (one claim "
    "statement; see docs/explanation/architecture.md); remove it.",
}


@register()
def check_retired_settings(app_configs: Any = None, **kwargs: Any) -> list:
    """Settings pgqueue no longer reads are named, so that an operator can remove them."""
    return [
        Warning(f"PGQUEUE[{name!r}] is no longer used: {RETIRED[name]}", id="pgqueue.W003")
        for name in sorted(set(pgqueue_settings.user_settings) & set(RETIRED))
    ]


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list:
    """Every PGQUEUE setting is known and has a usable value."""
    s = pgqueue_settings
    problems: list[str] = []
    unknown = sorted(set(s.user_settings) - set(DEFAULTS) - set(RETIRED))
    if unknown:
        problems.append(
            f"Unknown PGQUEUE setting(s): {', '.join(unknown)}. "
            f"Known settings: {', '.join(sorted(DEFAULTS))}."
        )
    for name, minimum, integer in [
        ("LEASE_SECONDS", 1, False),
        ("MAX_LOST_CLAIMS", 1, True),
        ("BACKOFF_BASE", 0, False),
        ("BACKOFF_CAP", 0, False),
        ("MAX_RETRY_DELAY_SECONDS", 1, False),
        ("MAX_SNOOZES", 0, True),
        ("MAX_WORKFLOW_JOBS", 1, True),
        ("MAX_DEPENDENCIES", 1, True),
        ("MAX_UPSTREAM_RESULT_BYTES", 2, True),
        ("WAITING_SWEEP_BATCH", 1, True),
        ("POLL_SECONDS", 0.01, False),
        ("MAINTENANCE_SECONDS", 0.01, False),
        ("BATCH_SIZE", 1, True),
        ("MAINTENANCE_BATCH_SIZE", 1, True),
        ("MAX_PAYLOAD_BYTES", 2, True),
        ("MAX_RESULT_BYTES", 2, True),
        ("MAX_OUTPUT_BYTES", 2, True),
        ("MAX_PROGRESS_NOTE_CHARS", 0, True),
        ("MAX_JSON_DEPTH", 1, True),
        ("CONNECT_ATTEMPTS", 1, True),
        ("PREFETCH", 0, True),
        ("PREFETCH_SECONDS", 0, False),
        ("PREFETCH_HOLD_SECONDS", 0.001, False),
        ("API_TRUSTED_PROXIES", 0, True),
        ("PRUNE_BATCH_SIZE", 1, True),
        ("PRUNE_BATCHES_PER_PASS", 1, True),
        ("UNKNOWN_TASK_DELAY_SECONDS", 0, False),
        ("MAX_TIMEOUT_SECONDS", 1, False),
        ("LIMITS_RECOUNT_SECONDS", 0.01, False),
        ("RESULT_RECHECK_SECONDS", 0.01, False),
        ("LIMITS_GATE_BATCH", 1, True),
        ("METRICS_LIMIT_SERIES", 1, True),
        ("METRICS_TENANT_SERIES", 0, True),
        ("METRICS_TENANT_IDLE_SECONDS", 1, False),
        ("HEALTH_STALL_SECONDS", 1, False),
        ("KEY_ADMIT_BATCH", 1, True),
        ("PERIODIC_MIN_INTERVAL_SECONDS", 1, True),
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
    if s.DEFAULT_TIMEOUT_SECONDS is not None:
        problem = _number("DEFAULT_TIMEOUT_SECONDS", s.DEFAULT_TIMEOUT_SECONDS, minimum=0.001)
        limit = s.MAX_TIMEOUT_SECONDS
        if not problem and isinstance(limit, int | float) and s.DEFAULT_TIMEOUT_SECONDS > limit:
            problem = "PGQUEUE['DEFAULT_TIMEOUT_SECONDS'] must be at most MAX_TIMEOUT_SECONDS."
        if problem:
            problems.append(problem)
    if s.LOG_FORMAT not in ("logfmt", "json"):
        problems.append(
            f'PGQUEUE[\'LOG_FORMAT\'] must be "logfmt" or "json", got {s.LOG_FORMAT!r}.'
        )
    if not isinstance(s.TRACING, bool):
        problems.append(f"PGQUEUE['TRACING'] must be True or False, got {s.TRACING!r}.")
    if s.HEALTH_DIR is not None and not isinstance(s.HEALTH_DIR, str | os.PathLike):
        problems.append(f"PGQUEUE['HEALTH_DIR'] must be a path or None, got {s.HEALTH_DIR!r}.")
    dma = s.DEFAULT_MAX_ATTEMPTS
    if isinstance(dma, bool) or not isinstance(dma, int) or not 1 <= dma <= 100:
        problems.append(f"PGQUEUE['DEFAULT_MAX_ATTEMPTS'] must be an integer 1..100, got {dma!r}.")
    dkm = s.DEFAULT_KEY_MAX_RUNNING
    if isinstance(dkm, bool) or not isinstance(dkm, int) or not 1 <= dkm <= KEY_MAX_RUNNING_BOUND:
        problems.append(
            f"PGQUEUE['DEFAULT_KEY_MAX_RUNNING'] must be an integer 1..{KEY_MAX_RUNNING_BOUND}, "
            f"got {dkm!r}."
        )
    if not isinstance(s.DEAD_JOB_HOLDS_KEY, bool):
        problems.append(
            f"PGQUEUE['DEAD_JOB_HOLDS_KEY'] must be True or False, got {s.DEAD_JOB_HOLDS_KEY!r}."
        )
    if s.ORDERING not in ORDERINGS:
        problems.append(f"PGQUEUE['ORDERING'] must be one of {ORDERINGS}, got {s.ORDERING!r}.")
    if s.FAIRNESS not in FAIRNESS_MODES:
        problems.append(f"PGQUEUE['FAIRNESS'] must be one of {FAIRNESS_MODES}, got {s.FAIRNESS!r}.")
    for name in ("FAIRNESS_DEFAULT_SECONDS", "FAIRNESS_MIN_SECONDS"):
        problem = _number(name, getattr(s, name), minimum=0.000001)
        if problem:
            problems.append(problem)
    for name in ("DEFAULT_QUEUE", "DEFAULT_TENANT", "NOTIFY_CHANNEL"):
        value = getattr(s, name)
        if not isinstance(value, str) or not value or len(value) > 63:
            problems.append(f"PGQUEUE[{name!r}] must be a non-empty string, got {value!r}.")
    modules = s.TASK_MODULES
    if not isinstance(modules, list | tuple) or not all(isinstance(m, str) for m in modules):
        problems.append(f"PGQUEUE['TASK_MODULES'] must be a list of module names, got {modules!r}.")
    for name in ("API_RATE_LIMIT", "AUTH_FAILURE_RATE"):
        problem = _rate(name, getattr(s, name))
        if problem:
            problems.append(problem)
    problems.extend(_retention_problems(s.RETENTION))
    if s.MAX_QUEUES_PER_TENANT is not None:
        problem = _number("MAX_QUEUES_PER_TENANT", s.MAX_QUEUES_PER_TENANT, minimum=1, integer=True)
        if problem:
            problems.append(problem.replace(" must be ", " must be None or ", 1))
    for name, minimum in (("COUNT_CAP", 1), ("API_PAGE_BYTES", 1024), ("API_FIELD_BYTES", 64)):
        problem = _number(name, getattr(s, name), minimum=minimum, integer=True)
        if problem:
            problems.append(problem)
    return [
        Error(
            p,
            hint="Fix settings.PGQUEUE; every setting is in docs/reference/settings.md.",
            id="pgqueue.E003",
        )
        for p in problems
    ]


@register()
def check_periodic(app_configs: Any = None, **kwargs: Any) -> list:
    """Every periodic schedule (code and ``PGQUEUE["PERIODIC"]``) could be enqueued.

    Run by ``runworker`` before it syncs the schedules, so a typo in a cron, a task name or
    a tenant stops the worker with the schedule's name rather than at its first tick.
    """
    import datetime as dt

    from . import schedules
    from .exceptions import PgQueueError

    entries = pgqueue_settings.PERIODIC
    if not isinstance(entries, list | tuple):
        return [
            Error(
                f"PGQUEUE['PERIODIC'] must be a list of dicts, got {entries!r}.",
                hint="See docs/guide/periodic.md.",
                id="pgqueue.E004",
            )
        ]
    problems: list[str] = []
    try:
        declared = schedules.declared_schedules()
    except ValueError as exc:
        problems.append(str(exc))
        declared = []
    now = dt.datetime.now(dt.UTC)
    for schedule in declared:
        try:
            schedules.resolve(schedule, now)
        except (PgQueueError, ValueError) as exc:
            problems.append(f"periodic schedule {schedule.name!r}: {exc}")
    return [Error(p, hint="See docs/guide/periodic.md.", id="pgqueue.E004") for p in problems]


def _retention_problems(retention: Any) -> list[str]:
    """RETENTION is ``{status: seconds >= 0 | timedelta >= 0 | None}`` for finished statuses.

    A typo in a status name would otherwise keep that status forever without a word.
    """
    if not isinstance(retention, dict):
        return [
            "PGQUEUE['RETENTION'] must be a dict {status: seconds, timedelta or None}, "
            f"got {retention!r}."
        ]
    problems = []
    unknown = sorted(str(k) for k in retention if k not in FINISHED_STATUSES)
    if unknown:
        problems.append(
            f"PGQUEUE['RETENTION'] names unknown status(es) {', '.join(unknown)}; "
            f"retention applies to {', '.join(FINISHED_STATUSES)}."
        )
    for status, keep in retention.items():
        if status not in FINISHED_STATUSES or keep is None:
            continue
        if isinstance(keep, dt.timedelta):
            seconds: Any = keep.total_seconds()
        elif isinstance(keep, int | float) and not isinstance(keep, bool):
            seconds = keep
        else:
            seconds = None
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            problems.append(
                f"PGQUEUE['RETENTION'][{status!r}] must be seconds >= 0, a timedelta or "
                f"None (keep forever), got {keep!r}."
            )
    return problems


@register()
def check_task_modules(app_configs: Any = None, **kwargs: Any) -> list:
    """Each ``TASK_MODULES`` entry of an installed app imports (pgqueue.W001), and each
    entry but the default is a module of some installed app (pgqueue.W002).

    A worker whose tasks module failed to import has no handler for its tasks: it gives
    their jobs back (they wait) instead of running them. An app without such a module is
    fine: that is ``ModuleNotFoundError`` naming the module itself, whereas one raised for
    another name (a missing dependency imported inside it) is a failure of the module.
    """
    modules = pgqueue_settings.TASK_MODULES
    if not isinstance(modules, list | tuple):
        return []  # check_settings reports it
    warnings: list = []
    for module in modules:
        if not isinstance(module, str):
            continue
        found = False
        for app_config in apps.get_app_configs():
            name = f"{app_config.name}.{module}"
            try:
                import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name == name:
                    continue  # the app simply has no such module
                warnings.append(_task_module_warning(name, exc))
            except Exception as exc:
                warnings.append(_task_module_warning(name, exc))
            found = True
        if not found and module not in DEFAULTS["TASK_MODULES"]:
            warnings.append(
                Warning(
                    f"PGQUEUE['TASK_MODULES'] names {module!r}, a module of no installed app.",
                    hint="A misspelt entry registers no task: workers then have no handler "
                    "for the tasks and give their jobs back to wait instead of running them.",
                    id="pgqueue.W002",
                )
            )
    return warnings


def _task_module_warning(name: str, exc: BaseException) -> Warning:
    return Warning(
        f"The tasks module {name!r} (PGQUEUE['TASK_MODULES']) raises on import: "
        f"{type(exc).__name__}: {exc}",
        hint="Fix the module: until it imports, workers have no handler for its tasks and "
        "give their jobs back to wait instead of running them.",
        id="pgqueue.W001",
    )


@register()
def check_api_scope(app_configs: Any = None, **kwargs: Any) -> list:
    """API_TASKS and TENANT_MAX_PRIORITY: what the HTTP API may enqueue, at what priority."""
    from .keys import api_tasks_problem

    s = pgqueue_settings
    problems = []
    problem = api_tasks_problem(s.API_TASKS)
    if problem:
        problems.append(f"PGQUEUE['API_TASKS'] {problem}, got {s.API_TASKS!r}.")
    tmp = s.TENANT_MAX_PRIORITY
    if isinstance(tmp, bool) or not isinstance(tmp, int) or not -100 <= tmp <= 100:
        problems.append(
            f"PGQUEUE['TENANT_MAX_PRIORITY'] must be an integer -100..100, got {tmp!r}."
        )
    return [
        Error(
            p,
            hint="Fix settings.PGQUEUE; see docs/explanation/security.md.",
            id="pgqueue.E005",
        )
        for p in problems
    ]
