"""Periodic jobs: schedules declared in code, each tick enqueued once by maintenance.

(Named ``schedules`` so that ``pgqueue.periodic`` stays the decorator users call.)

A schedule is declared with ``@pgqueue.periodic(cron, ...)`` stacked on a
``@pgqueue.task``, with ``pgqueue.periodic(cron, task="name", ...)``, or as a dict in
``PGQUEUE["PERIODIC"]``. Code owns what a schedule is; the database owns whether it runs:

- ``sync_schedules`` (``runworker`` calls it at start-up) upserts every declared schedule
  into ``pgqueue_periodic`` and marks the rows no longer declared as removed. It never
  touches ``enabled``, so a schedule an operator disabled stays disabled across deploys.
- ``enqueue_due`` (the maintenance duty ``enqueue_due_periodic``, about once a second, one
  worker at a time) locks the due rows, enqueues one job per due schedule through
  ``store.enqueue`` (the tenant's fair clock is charged as for any enqueue) and moves
  ``next_run_at`` to the next tick with a compare-and-set.

Once per tick, whatever the number of workers and hosts: the job's idempotency key is
``periodic:<name>:<tick in UTC, ISO 8601>`` under the schedule's tenant, and jobs have a
unique (tenant, idempotency_key): a second enqueue of a tick, by whatever path, inserts
nothing. Two more guards stand before it, each enough alone (tests/test_periodic.py races
four connections with the others removed): the due rows are taken ``FOR UPDATE SKIP
LOCKED``, and ``next_run_at`` moves by compare-and-set, whose failure rolls back that
schedule's savepoint, enqueue included. No leader is elected, so none can split.

Ticks are computed by cronsim (Debian cron's semantics) on the wall clock of the
schedule's time zone (``settings.TIME_ZONE`` unless the schedule names one), then stored
as instants. On a spring-forward day a tick inside the skipped hour fires at the first
instant after the gap (02:30 in Europe/Paris fires at 03:00 CEST); on a fall-back day a
tick in the repeated hour fires once, at its first occurrence (02:30 CEST).

Missed ticks (no worker ran when they were due): the schedule's ``missed`` policy says
``"run_once"`` (one job, for the latest missed tick, when a worker is back) or ``"skip"``
(none; a tick still counts as on time up to ``MISSED_GRACE`` after its instant). Never a
burst of every missed tick.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.db import connections, transaction

from . import schedule_store, store, timeouts
from .conf import pgqueue_settings, queue_db
from .exceptions import PgQueueError
from .registry import RegisteredTask

logger = logging.getLogger("pgqueue.schedules")

SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,150}\Z")
MISSED_POLICIES = ("run_once", "skip")
#: A tick enqueued later than this after its instant was missed (``missed="skip"`` drops
#: it). Maintenance runs about once a second, so an on-time tick is a second or two late.
MISSED_GRACE = dt.timedelta(seconds=60)
#: The keys a ``PGQUEUE["PERIODIC"]`` entry may have (``cron`` and ``task`` are required).
SETTING_KEYS = frozenset(
    {"name", "cron", "task", "tenant", "queue", "priority", "max_attempts", "payload"}
    | {"missed", "timezone"}
)


class ScheduleNotFound(PgQueueError, LookupError):
    """No periodic schedule has this name."""


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule as declared: the options are those of an enqueue call."""

    name: str
    cron: str
    task: str
    tenant: str | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    payload: Any = None
    missed: str = "run_once"
    timezone: str | None = None  # None: settings.TIME_ZONE


_declared: dict[str, Schedule] = {}


# -- ticks ----------------------------------------------------------------------------------


def zone(name: str | None) -> ZoneInfo:
    """The schedule's time zone: ``name``, else ``settings.TIME_ZONE`` (UTC when unset)."""
    return ZoneInfo(name or getattr(settings, "TIME_ZONE", None) or "UTC")


def next_tick(cron: str, tz: str | None, after: dt.datetime) -> dt.datetime:
    """The first tick strictly after ``after`` (aware), as an instant in UTC.

    Computed on the wall clock of ``tz``; raises ValueError for a schedule that never fires
    (cronsim looks 50 years ahead).
    """
    try:
        local = next(CronSim(cron, after.astimezone(zone(tz))))
    except StopIteration:
        raise ValueError(f"cron {cron!r} has no tick in the next 50 years") from None
    return local.astimezone(dt.UTC)


def last_tick(cron: str, tz: str | None, at_or_before: dt.datetime) -> dt.datetime | None:
    """The latest tick at or before ``at_or_before`` (aware), in UTC; None if none in 50 years."""
    start = at_or_before.astimezone(zone(tz)) + dt.timedelta(microseconds=1)
    try:
        return next(CronSim(cron, start, reverse=True)).astimezone(dt.UTC)
    except StopIteration:
        return None


def tick_key(name: str, tick: dt.datetime) -> str:
    """The idempotency key of a schedule's job for ``tick``: one job per tick."""
    return f"periodic:{name}:{tick.astimezone(dt.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


# -- declaring ------------------------------------------------------------------------------


def validate_schedule(schedule: Schedule) -> Schedule:
    """Refuse what can be refused without the database or the task registry."""
    if not isinstance(schedule.name, str) or not SCHEDULE_NAME_RE.match(schedule.name):
        raise ValueError(
            f"invalid periodic schedule name {schedule.name!r}: use [A-Za-z0-9_.:-], 1..150"
        )
    if not isinstance(schedule.cron, str):
        raise ValueError(f"schedule {schedule.name!r}: cron must be a string")
    try:
        CronSim(schedule.cron, dt.datetime.now(dt.UTC))
    except CronSimError as exc:
        raise ValueError(
            f"schedule {schedule.name!r}: invalid cron {schedule.cron!r}: {exc}"
        ) from None
    if schedule.missed not in MISSED_POLICIES:
        raise ValueError(
            f"schedule {schedule.name!r}: missed must be one of {MISSED_POLICIES}, "
            f"got {schedule.missed!r}"
        )
    if schedule.timezone is not None:
        try:
            zone(schedule.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValueError(
                f"schedule {schedule.name!r}: unknown time zone {schedule.timezone!r}"
            ) from None
    return schedule


def declare(schedule: Schedule) -> Schedule:
    """Add a schedule to those of the code; refuse a name another task's schedule holds."""
    validate_schedule(schedule)
    existing = _declared.get(schedule.name)
    if existing is not None and existing.task != schedule.task:
        raise ValueError(
            f"periodic schedule name {schedule.name!r} is already used for task "
            f"{existing.task!r}: give each schedule its own name="
        )
    _declared[schedule.name] = schedule  # a module imported again declares it again
    return schedule


def undeclare(name: str) -> None:
    """Forget a schedule declared in code (for tests that declare throwaway ones)."""
    _declared.pop(name, None)


def periodic(
    cron: str,
    *,
    task: str | None = None,
    name: str | None = None,
    tenant: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    payload: Any = None,
    missed: str = "run_once",
    timezone: str | None = None,
) -> Any:
    """Run a task on a cron schedule: one job per tick, whatever the number of workers.

    Stacked on ``@pgqueue.task`` it returns the task unchanged; with ``task="name"`` it
    declares the schedule at once and returns it. ``name`` (unique; default: the task's
    name) identifies the schedule in the database, so renaming it makes a new schedule.
    The other options are those of ``pgqueue.enqueue``, defaulted the same way.
    """

    def make(task_name: str) -> Schedule:
        return declare(
            Schedule(
                name=name or task_name,
                cron=cron,
                task=task_name,
                tenant=tenant,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                payload=payload,
                missed=missed,
                timezone=timezone,
            )
        )

    if task is not None:
        return make(task)

    def decorate(registered: RegisteredTask) -> RegisteredTask:
        if not isinstance(registered, RegisteredTask):
            raise TypeError("@pgqueue.periodic goes above @pgqueue.task (it needs the task)")
        make(registered.name)
        return registered

    return decorate


def schedule_from_setting(entry: Any) -> Schedule:
    """One ``PGQUEUE["PERIODIC"]`` entry as a Schedule; ValueError says what is wrong."""
    if not isinstance(entry, dict):
        raise ValueError(f"PGQUEUE['PERIODIC'] entries must be dicts, got {entry!r}")
    unknown = sorted(set(entry) - SETTING_KEYS)
    if unknown:
        raise ValueError(
            f"PGQUEUE['PERIODIC'] entry {entry.get('name', entry.get('task'))!r} has unknown "
            f"key(s) {', '.join(unknown)}; known: {', '.join(sorted(SETTING_KEYS))}"
        )
    missing = [k for k in ("cron", "task") if not entry.get(k)]
    if missing:
        raise ValueError(f"PGQUEUE['PERIODIC'] entry {entry!r} needs {' and '.join(missing)}")
    options = dict(entry)
    options.setdefault("name", entry["task"])
    options.setdefault("missed", "run_once")
    return validate_schedule(Schedule(**options))


def declared_schedules() -> list[Schedule]:
    """Every schedule of the code and of ``PGQUEUE["PERIODIC"]``, by name."""
    schedules = dict(_declared)
    for entry in pgqueue_settings.PERIODIC or []:
        schedule = schedule_from_setting(entry)
        if schedule.name in schedules and schedules[schedule.name] != schedule:
            raise ValueError(
                f"periodic schedule {schedule.name!r} is declared both in code and in "
                "PGQUEUE['PERIODIC']"
            )
        schedules[schedule.name] = schedule
    return [schedules[name] for name in sorted(schedules)]


# -- syncing --------------------------------------------------------------------------------


def resolve(schedule: Schedule, now: dt.datetime) -> dict[str, Any]:
    """The schedule's row: the enqueue options validated and defaulted as an enqueue's.

    Raises UnknownTask or InvalidJob (or PayloadTooLarge) for what an enqueue would refuse.
    """
    from .services import encode_payload, resolve_options

    opts = resolve_options(
        schedule.task,
        tenant=schedule.tenant,
        queue=schedule.queue,
        priority=schedule.priority,
        max_attempts=schedule.max_attempts,
    )
    tz = zone(schedule.timezone).key
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": tz,
        "task": opts.task,
        "tenant": opts.tenant,
        "queue": opts.queue,
        "priority": opts.priority,
        "max_attempts": opts.max_attempts,
        "payload": json.loads(encode_payload(schedule.payload)),
        "missed": schedule.missed,
        "next_run_at": next_tick(schedule.cron, tz, now).isoformat(),
    }


@dataclass
class SyncResult:
    """What a start-up sync did: the schedules of the code, and those it marked removed."""

    declared: list[str]
    removed: list[str]


def sync_schedules(*, using: str | None = None, now: dt.datetime | None = None) -> SyncResult:
    """Make ``pgqueue_periodic`` match the declared schedules (``runworker`` start-up).

    New schedules start at their first tick after ``now``; a schedule whose cron or time
    zone changed, or that comes back after a removal, restarts from there too. The others
    keep their ``next_run_at``, and every schedule keeps its ``enabled``. Safe to run from
    many workers at once: one statement, rows upserted in name order.
    """
    now = now or dt.datetime.now(dt.UTC)
    rows = [resolve(s, now) for s in declared_schedules()]
    with transaction.atomic(using=queue_db(using)), connections[queue_db(using)].cursor() as cursor:
        removed = schedule_store.periodic_sync(cursor, specs_json=json.dumps(rows))
    if removed:
        logger.info("event=periodic_removed schedules=%s", ",".join(removed))
    return SyncResult([r["name"] for r in rows], removed)


def set_periodic_enabled(
    name: str, enabled: bool, *, using: str | None = None, now: dt.datetime | None = None
) -> bool:
    """Turn a schedule on or off (the admin's toggle); returns whether it changed.

    Turning it back on starts from the next tick after ``now``: the ticks that passed while
    it was off were not missed, they were not wanted. Raises ScheduleNotFound.
    """
    now = now or dt.datetime.now(dt.UTC)
    with transaction.atomic(using=queue_db(using)), connections[queue_db(using)].cursor() as cursor:
        row = schedule_store.periodic_lock(cursor, name=name)
        if row is None:
            raise ScheduleNotFound(f"no periodic schedule is named {name!r}")
        cron, tz, was_enabled = row
        if was_enabled == bool(enabled):
            return False
        schedule_store.periodic_set_enabled(
            cursor, name=name, enabled=bool(enabled), next_run_at=next_tick(cron, tz, now)
        )
    return True


# -- enqueueing (the maintenance duty) ------------------------------------------------------


@dataclass(frozen=True)
class Fired:
    """What the duty did for one due schedule: the tick it enqueued (None: skipped)."""

    name: str
    tick: dt.datetime | None
    job_id: int | None
    next_run_at: dt.datetime


def plan(
    row: schedule_store.DueSchedule, now: dt.datetime
) -> tuple[dt.datetime | None, dt.datetime]:
    """The tick to enqueue for a due schedule (None: none) and its next ``next_run_at``.

    The tick is the latest one at or before ``now``, so a schedule back from a gap enqueues
    one job, not one per missed tick; ``missed="skip"`` enqueues it only if on time.
    """
    latest = last_tick(row.cron, row.timezone, now)
    tick = latest if latest is not None and latest >= row.next_run_at else row.next_run_at
    if row.missed == "skip" and now - tick > MISSED_GRACE:
        tick = None
    return tick, next_tick(row.cron, row.timezone, now)


def enqueue_due(
    cursor: Any,
    *,
    now: dt.datetime | None = None,
    limit: int | None = None,
    on_error: Callable[[str, Exception], None] | None = None,
) -> list[Fired]:
    """Enqueue the due schedules' jobs on ``cursor`` (a psycopg cursor, in a transaction).

    Each schedule is its own savepoint: a schedule that fails (its row is left due, to be
    tried again and logged again) costs the others nothing, nor the rest of maintenance,
    whose lease rescue must not stop for, say, a host that lacks a time zone.
    """
    now = now or dt.datetime.now(dt.UTC)
    fired: list[Fired] = []
    for row in schedule_store.periodic_lock_due(cursor, now=now, limit=limit):
        try:
            with cursor.connection.transaction():
                fired.append(_fire(cursor, row, now))
        except _Moved:
            logger.warning("schedule=%s event=periodic_moved_by_another", row.name)
        except Exception as exc:  # the savepoint is rolled back; maintenance goes on
            logger.error("schedule=%s event=periodic_failed error=%r", row.name, exc)
            if on_error is not None:
                on_error(row.name, exc)
    return fired


class _Moved(Exception):
    """The schedule's next_run_at was no longer the one this run fired for."""


def _fire(cursor: Any, row: schedule_store.DueSchedule, now: dt.datetime) -> Fired:
    tick, next_run_at = plan(row, now)
    job_id = None
    if tick is not None:
        key = tick_key(row.name, tick)
        ids, charged = store.enqueue(
            cursor,
            task=row.task,
            tenant=row.tenant,
            queue=row.queue,
            priority=row.priority,
            max_attempts=row.max_attempts,
            payloads_json=f"[{row.payload_json}]",
            count=1,
            idempotency_key=key,
            timeout=timeouts.for_task(row.task),
        )
        if ids:
            job_id = ids[0].id
        else:  # the tick's job exists already: nothing inserted, the clock refunded
            if charged:
                store.refund_clock(
                    cursor,
                    task=row.task,
                    tenant=row.tenant,
                    queue=row.queue,
                    priority=row.priority,
                    count=1,
                )
            job_id = store.job_id_for_key(cursor, tenant=row.tenant, idempotency_key=key)
    advanced = schedule_store.periodic_advance(
        cursor,
        name=row.name,
        due=row.next_run_at,
        next_run_at=next_run_at,
        tick=tick,
        job_id=job_id,
    )
    if not advanced:  # another enqueuer fired this tick first: undo ours (the savepoint)
        raise _Moved(row.name)
    if tick is None:
        logger.info("schedule=%s event=periodic_skipped_missed due=%s", row.name, row.next_run_at)
    else:
        logger.info("schedule=%s event=periodic_enqueued tick=%s job=%s", row.name, tick, job_id)
    return Fired(row.name, tick, job_id, next_run_at)
