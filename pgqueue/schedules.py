"""Periodic jobs: schedules declared in code or created in the admin, each tick enqueued
once by maintenance.

(Named ``schedules`` so that ``pgqueue.periodic`` stays the decorator users call.)

A schedule runs a task on a cron expression (``cron``, on the wall clock of its time
zone) or at a fixed interval (``every``), never both. It comes from one of two places,
its row's ``source``:

- **code**: ``@pgqueue.periodic(...)`` stacked on a ``@pgqueue.task``,
  ``pgqueue.periodic(..., task="name")``, or a dict in ``PGQUEUE["PERIODIC"]``.
  ``sync_schedules`` (``runworker`` calls it at start-up) upserts every declared schedule
  into ``pgqueue_periodic`` and marks the code's rows no longer declared as removed. Code
  owns what such a schedule is; the database owns only whether it runs (``enabled``, which
  a sync never touches, so a schedule an operator disabled stays disabled across deploys).
- **admin**: ``create_schedule`` / ``update_schedule`` / ``delete_schedule`` (the admin's
  add, change and delete pages). A sync never touches these rows, unless code declares
  the same name: code then takes the row over (logged, and reported by the sync).

Every change goes through this module (the admin and the CLI write no row themselves) and
is validated as an enqueue is (``services.resolve_options``, ``services.encode_payload``),
so bad input is refused with the field and the reason (``InvalidSchedule``, an
``InvalidJob``). ``run_schedule_now`` enqueues one job of a schedule at once, leaving its
next tick where it was.

``enqueue_due`` (the maintenance duty ``enqueue_due_periodic``, about once a second, one
worker at a time) locks the due rows, enqueues one job per due schedule through
``store.enqueue`` (the tenant's fair clock is charged as for any enqueue) and moves
``next_run_at`` to the next tick with a compare-and-set. Cron and interval schedules take
the same path.

Once per tick, whatever the number of workers and hosts: the job's idempotency key is
``periodic:<name>:<tick in UTC, ISO 8601>`` under the schedule's tenant, and jobs have a
unique (tenant, idempotency_key): a second enqueue of a tick, by whatever path, inserts
nothing. Two more guards stand before it, each enough alone (tests/test_periodic.py races
four connections with the others removed): the due rows are taken ``FOR UPDATE SKIP
LOCKED``, and ``next_run_at`` moves by compare-and-set, whose failure rolls back that
schedule's savepoint, enqueue included. No leader is elected, so none can split.

Cron ticks are computed by cronsim (Debian cron's semantics) on the wall clock of the
schedule's time zone (``settings.TIME_ZONE`` unless the schedule names one), then stored
as instants. On a spring-forward day a tick inside the skipped hour fires at the first
instant after the gap (02:30 in Europe/Paris fires at 03:00 CEST); on a fall-back day a
tick in the repeated hour fires once, at its first occurrence (02:30 CEST).

Interval ticks are the multiples of the interval since the Unix epoch (1970-01-01 00:00
UTC): ``every=1h`` fires on the hour, ``every=1d`` at midnight UTC. A tick is a function of
the interval alone, like a cron tick of its expression, so the next one follows from the
last one, never from when a worker happened to run (no drift), and whole seconds keep the
tick keys exact. Intervals are whole seconds from ``PGQUEUE["PERIODIC_MIN_INTERVAL_SECONDS"]``
to ``MAX_INTERVAL``.

Missed ticks (no worker ran when they were due): the schedule's ``missed`` policy says
``"run_once"`` (one job, for the latest missed tick, when a worker is back) or ``"skip"``
(none; a tick still counts as on time up to ``MISSED_GRACE`` after its instant). Never a
burst of every missed tick.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.db import connections, transaction
from django.utils.dateparse import parse_duration

from . import schedule_store, store, timeouts, tracing
from .conf import pgqueue_settings, queue_db
from .exceptions import InvalidJob, PgQueueError
from .registry import RegisteredTask, get_task

logger = logging.getLogger("pgqueue.schedules")

SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,150}\Z")
MISSED_POLICIES = ("run_once", "skip")
#: A tick enqueued later than this after its instant was missed (``missed="skip"`` drops
#: it). Maintenance runs about once a second, so an on-time tick is a second or two late.
MISSED_GRACE = dt.timedelta(seconds=60)
#: The longest interval (``every``): a year. Longer cadences are a cron's (``0 0 1 1 *``).
MAX_INTERVAL = dt.timedelta(days=365)
#: Interval ticks are the multiples of the interval since this instant.
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: The keys a ``PGQUEUE["PERIODIC"]`` entry may have (``task``, and ``cron`` or ``every``).
SETTING_KEYS = frozenset(
    {"name", "cron", "every", "task", "tenant", "queue", "priority", "max_attempts"}
    | {"payload", "missed", "timezone"}
)
#: Who owns a schedule's definition (``pgqueue_periodic.source``).
SOURCE_CODE = "code"
SOURCE_ADMIN = "admin"


class ScheduleNotFound(PgQueueError, LookupError):
    """No periodic schedule has this name."""

    code = "not_found"


class ScheduleInCode(PgQueueError):
    """This schedule is declared in code: change it there (each worker's start-up copies it);
    only its on/off switch is the operator's."""

    code = "conflict"


class InvalidSchedule(InvalidJob, ValueError):
    """The periodic schedule was refused: one of its fields is invalid.

    An ``InvalidJob`` (``field``, ``reason``: what a form shows on the field) and a
    ``ValueError`` (what a bad declaration in code raises at import).
    """

    code = "invalid_schedule"

    def __init__(
        self, field: str, reason: str, schedule: str | None = None, *, message: str | None = None
    ) -> None:
        super().__init__(field, reason)
        if message is None:
            message = f"{field} {reason}"
            if schedule is not None:
                message = f"schedule {schedule!r}: {message}"
        self.args = (message,)


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule as declared: a cadence (``cron`` or ``every``) and the options of
    an enqueue call. ``every`` is normalised to a timedelta by ``validate_schedule``."""

    name: str
    task: str
    cron: str | None = None
    every: dt.timedelta | float | None = None
    tenant: str | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    payload: Any = None
    missed: str = "run_once"
    timezone: str | None = None  # cron only; None: settings.TIME_ZONE


_declared: dict[str, Schedule] = {}


# -- ticks ----------------------------------------------------------------------------------


def zone(name: str | None) -> ZoneInfo:
    """The schedule's time zone: ``name``, else ``settings.TIME_ZONE`` (UTC when unset)."""
    return ZoneInfo(name or getattr(settings, "TIME_ZONE", None) or "UTC")


def next_tick(cron: str, tz: str | None, after: dt.datetime) -> dt.datetime:
    """The first cron tick strictly after ``after`` (aware), as an instant in UTC.

    Computed on the wall clock of ``tz``; raises ValueError for a schedule that never fires
    (cronsim looks 50 years ahead).
    """
    try:
        local = next(CronSim(cron, after.astimezone(zone(tz))))
    except StopIteration:
        raise ValueError(f"cron {cron!r} has no tick in the next 50 years") from None
    return local.astimezone(dt.UTC)


def last_tick(cron: str, tz: str | None, at_or_before: dt.datetime) -> dt.datetime | None:
    """The latest cron tick at or before ``at_or_before`` (aware), in UTC; None if none in
    50 years."""
    start = at_or_before.astimezone(zone(tz)) + dt.timedelta(microseconds=1)
    try:
        return next(CronSim(cron, start, reverse=True)).astimezone(dt.UTC)
    except StopIteration:
        return None


def next_due(
    cron: str | None, tz: str | None, every: dt.timedelta | None, after: dt.datetime
) -> dt.datetime:
    """A schedule's first tick strictly after ``after``: its cron's, or the first multiple
    of ``every`` since EPOCH."""
    if every is not None:
        return EPOCH + ((after - EPOCH) // every + 1) * every
    assert cron is not None  # the table's CHECK: a cron or an interval
    return next_tick(cron, tz, after)


def last_due(
    cron: str | None, tz: str | None, every: dt.timedelta | None, at_or_before: dt.datetime
) -> dt.datetime | None:
    """A schedule's latest tick at or before ``at_or_before`` (None: a cron with none)."""
    if every is not None:
        return EPOCH + ((at_or_before - EPOCH) // every) * every
    assert cron is not None
    return last_tick(cron, tz, at_or_before)


def tick_key(name: str, tick: dt.datetime) -> str:
    """The idempotency key of a schedule's job for ``tick``: one job per tick."""
    return f"periodic:{name}:{tick.astimezone(dt.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def run_now_key(name: str, at: dt.datetime) -> str:
    """The idempotency key of a job "run now" enqueued at ``at``: in the schedules'
    reserved namespace (so the job shows where it came from and no tenant can take it),
    and never a tick's (those have no fraction of a second)."""
    return f"periodic:{name}:now:{at.astimezone(dt.UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


# -- intervals ------------------------------------------------------------------------------

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_COMPACT_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\Z")


def min_interval() -> dt.timedelta:
    """The shortest interval a schedule may have (``PERIODIC_MIN_INTERVAL_SECONDS``)."""
    return dt.timedelta(seconds=pgqueue_settings.PERIODIC_MIN_INTERVAL_SECONDS)


def format_every(every: dt.timedelta) -> str:
    """An interval as the admin and the CLI print it (and ``parse_every`` reads it back):
    ``"30s"``, ``"5m"``, ``"1h 30m"``, ``"7d"``."""
    seconds = int(every.total_seconds())
    parts = []
    for unit, size in _UNITS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts) or "0s"


def parse_every(text: str) -> dt.timedelta:
    """An interval typed by a person: ``"90"`` (seconds), ``"30s"``, ``"5m"``, ``"1h 30m"``,
    ``"2d"``, or Django's duration forms (``"01:30:00"``, ``"1 00:00:00"``, ``"PT5M"``).
    Raises ValueError; the bounds are ``validate_schedule``'s."""
    compact = re.sub(r"\s+", "", text or "").lower()
    if not compact:
        raise ValueError("give an interval")
    match = _COMPACT_RE.match(compact)
    try:
        if compact.isdigit():
            return dt.timedelta(seconds=int(compact))
        if match:
            counts = zip(match.groups(), _UNITS.values(), strict=True)
            return dt.timedelta(seconds=sum(int(n) * size for n, size in counts if n))
        parsed = parse_duration((text or "").strip())
    except (ValueError, OverflowError):
        raise ValueError("far too long an interval") from None
    if parsed is None:
        raise ValueError('give an interval such as "30s", "5m", "1h 30m" or "2d"')
    return parsed


def check_interval(value: Any, name: str) -> dt.timedelta:
    """A declared ``every`` (a timedelta, or seconds) checked: whole seconds, in bounds."""
    if isinstance(value, dt.timedelta):
        every = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or abs(value) > MAX_INTERVAL.total_seconds() * 10:
            raise InvalidSchedule(
                "every", f"must be at most {format_every(MAX_INTERVAL)}, got {value!r}", name
            )
        every = dt.timedelta(seconds=value)
    else:
        raise InvalidSchedule(
            "every", f"must be a datetime.timedelta or a number of seconds, got {value!r}", name
        )
    if every % dt.timedelta(seconds=1):
        raise InvalidSchedule(
            "every", f"must be a whole number of seconds, got {every.total_seconds():g} s", name
        )
    low = min_interval()
    if every < low:
        raise InvalidSchedule(
            "every",
            f"must be at least {low.total_seconds():g} s "
            f"(PGQUEUE['PERIODIC_MIN_INTERVAL_SECONDS']), got {every.total_seconds():g} s",
            name,
        )
    if every > MAX_INTERVAL:
        raise InvalidSchedule(
            "every",
            f"must be at most {format_every(MAX_INTERVAL)} (365 days), got {format_every(every)}",
            name,
        )
    return every


# -- declaring ------------------------------------------------------------------------------


def validate_schedule(schedule: Schedule) -> Schedule:
    """Refuse what can be refused without the database or the task registry; returns the
    schedule with ``every`` as a timedelta. Raises InvalidSchedule naming the field."""
    name = schedule.name
    if not isinstance(name, str) or not SCHEDULE_NAME_RE.match(name):
        raise InvalidSchedule(
            "name",
            "must be 1 to 150 characters of A-Z, a-z, 0-9 and _ . : -",
            message=f"invalid periodic schedule name {name!r}: use [A-Za-z0-9_.:-], 1..150",
        )
    if schedule.cron is None and schedule.every is None:
        raise InvalidSchedule("cron", "or every is needed: give one of them", name)
    if schedule.cron is not None and schedule.every is not None:
        raise InvalidSchedule("every", "and cron cannot both be given: give one of them", name)
    every = None
    if schedule.every is not None:
        every = check_interval(schedule.every, name)
        if schedule.timezone is not None:
            raise InvalidSchedule(
                "timezone",
                "applies to cron schedules only (interval ticks are counted in UTC)",
                name,
            )
    else:
        if not isinstance(schedule.cron, str):
            raise InvalidSchedule("cron", "must be a string", name)
        try:
            CronSim(schedule.cron, dt.datetime.now(dt.UTC))
        except CronSimError as exc:
            raise InvalidSchedule(
                "cron",
                f"is not a valid cron expression: {exc}",
                message=f"schedule {name!r}: invalid cron {schedule.cron!r}: {exc}",
            ) from None
    if schedule.missed not in MISSED_POLICIES:
        raise InvalidSchedule(
            "missed", f"must be one of {MISSED_POLICIES}, got {schedule.missed!r}", name
        )
    if schedule.timezone is not None:
        try:
            zone(schedule.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise InvalidSchedule(
                "timezone", f"{schedule.timezone!r} is an unknown time zone", name
            ) from None
    return schedule if every is None else replace(schedule, every=every)


def declare(schedule: Schedule) -> Schedule:
    """Add a schedule to those of the code; refuse a name another task's schedule holds."""
    schedule = validate_schedule(schedule)
    existing = _declared.get(schedule.name)
    if existing is not None and existing.task != schedule.task:
        raise InvalidSchedule(
            "name",
            f"is already used for task {existing.task!r}",
            message=f"periodic schedule name {schedule.name!r} is already used for task "
            f"{existing.task!r}: give each schedule its own name=",
        )
    _declared[schedule.name] = schedule  # a module imported again declares it again
    return schedule


def undeclare(name: str) -> None:
    """Forget a schedule declared in code (for tests that declare throwaway ones)."""
    _declared.pop(name, None)


def periodic(
    cron: str | None = None,
    *,
    every: dt.timedelta | float | None = None,
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
    """Run a task on a cron schedule or every ``every`` (a timedelta, or seconds): one job
    per tick, whatever the number of workers.

    Give ``cron`` or ``every``, not both. Stacked on ``@pgqueue.task`` it returns the task
    unchanged; with ``task="name"`` it declares the schedule at once and returns it.
    ``name`` (unique; default: the task's name) identifies the schedule in the database, so
    renaming it makes a new schedule. The other options are those of ``pgqueue.enqueue``,
    defaulted the same way; ``timezone`` is for cron schedules only.
    """

    def make(task_name: str) -> Schedule:
        return declare(
            Schedule(
                name=name or task_name,
                task=task_name,
                cron=cron,
                every=every,
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
    if not entry.get("task"):
        raise ValueError(f"PGQUEUE['PERIODIC'] entry {entry!r} needs task")
    if entry.get("cron") is None and entry.get("every") is None:
        raise ValueError(f"PGQUEUE['PERIODIC'] entry {entry!r} needs cron or every")
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


def code_names() -> set[str]:
    """The names of the schedules this process's code and settings declare (a name the
    admin must not give a schedule of its own: the next start-up sync would take it)."""
    names = set(_declared)
    entries = pgqueue_settings.PERIODIC
    for entry in entries if isinstance(entries, list | tuple) else []:
        if isinstance(entry, dict) and (entry.get("name") or entry.get("task")):
            names.add(entry.get("name") or entry.get("task"))
    return names


# -- resolving ------------------------------------------------------------------------------


def resolve(schedule: Schedule, now: dt.datetime) -> dict[str, Any]:
    """The schedule's row: its cadence checked, the enqueue options validated and defaulted
    as an enqueue's, and its first tick after ``now``.

    Raises InvalidSchedule, UnknownTask or InvalidJob (or PayloadTooLarge) for what a
    declaration or an enqueue would refuse, each naming the field.
    """
    from .services import encode_payload, resolve_options

    schedule = validate_schedule(schedule)
    opts = resolve_options(
        schedule.task,
        tenant=schedule.tenant,
        queue=schedule.queue,
        priority=schedule.priority,
        max_attempts=schedule.max_attempts,
    )
    every = schedule.every
    assert every is None or isinstance(every, dt.timedelta)  # validate_schedule's
    tz = "UTC" if every is not None else zone(schedule.timezone).key
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "every_seconds": None if every is None else int(every.total_seconds()),
        "timezone": tz,
        "task": opts.task,
        "tenant": opts.tenant,
        "queue": opts.queue,
        "priority": opts.priority,
        "max_attempts": opts.max_attempts,
        "payload": json.loads(encode_payload(schedule.payload)),
        "missed": schedule.missed,
        "next_run_at": next_due(schedule.cron, tz, every, now),
    }


# -- syncing --------------------------------------------------------------------------------


@dataclass
class SyncResult:
    """What a start-up sync did: the schedules of the code, those it marked removed, and
    the admin's schedules it took over because code now declares their names."""

    declared: list[str]
    removed: list[str]
    taken: list[str] = field(default_factory=list)


def sync_schedules(*, using: str | None = None, now: dt.datetime | None = None) -> SyncResult:
    """Make the code's rows of ``pgqueue_periodic`` match the declared schedules
    (``runworker`` start-up).

    New schedules start at their first tick after ``now``; a schedule whose cadence (cron,
    interval, time zone) changed, that comes back after a removal, or whose name an
    admin-created schedule held, restarts from there too. The others keep their
    ``next_run_at``, and every schedule keeps its ``enabled``. Rows created in the admin
    are left alone. Safe to run from many workers at once: one statement, rows upserted in
    name order.
    """
    now = now or dt.datetime.now(dt.UTC)
    rows = [resolve(s, now) for s in declared_schedules()]
    specs = json.dumps([{**r, "next_run_at": r["next_run_at"].isoformat()} for r in rows])
    db = queue_db(using)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        changes = schedule_store.periodic_sync(cursor, specs_json=specs)
    if changes.removed:
        logger.info("event=periodic_removed schedules=%s", ",".join(changes.removed))
    if changes.taken:
        logger.warning(
            "event=periodic_taken_over_by_code schedules=%s "
            "detail=an admin-created schedule had the name of one declared in code",
            ",".join(changes.taken),
        )
    return SyncResult([r["name"] for r in rows], changes.removed, changes.taken)


# -- the operator's changes (the admin, the CLI) --------------------------------------------


def set_periodic_enabled(
    name: str, enabled: bool, *, using: str | None = None, now: dt.datetime | None = None
) -> bool:
    """Turn a schedule on or off (the admin's and the CLI's switch, for schedules of the
    code and of the admin alike); returns whether it changed.

    Turning it back on starts from the next tick after ``now``: the ticks that passed while
    it was off were not missed, they were not wanted. Raises ScheduleNotFound.
    """
    now = now or dt.datetime.now(dt.UTC)
    db = queue_db(using)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        row = schedule_store.periodic_lock(cursor, name=name)
        if row is None:
            raise ScheduleNotFound(f"no periodic schedule is named {name!r}")
        if row.enabled == bool(enabled):
            return False
        schedule_store.periodic_set_enabled(
            cursor,
            name=name,
            enabled=bool(enabled),
            next_run_at=next_due(row.cron, row.timezone, row.every, now),
        )
    return True


def check_new_schedule(schedule: Schedule, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """What ``create_schedule`` would store (``resolve``'s row), or InvalidSchedule /
    InvalidJob naming the field: also refuses a name the code declares."""
    row = resolve(schedule, now or dt.datetime.now(dt.UTC))
    if row["name"] in code_names():
        raise InvalidSchedule(
            "name",
            "is the name of a schedule declared in code (@pgqueue.periodic or "
            "PGQUEUE['PERIODIC']): choose another",
            row["name"],
        )
    return row


def create_schedule(
    schedule: Schedule,
    *,
    enabled: bool = True,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> int:
    """Create a schedule of the operator's (the admin's add page); returns its row's id.

    Validated as ``check_new_schedule`` says; it first runs at its first tick after
    ``now``. Raises InvalidSchedule (field ``name``) when the name is taken.
    """
    row = check_new_schedule(schedule, now=now)
    db = queue_db(using)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        new_id = schedule_store.periodic_insert(cursor, row=row, enabled=enabled)
    if new_id is None:
        raise InvalidSchedule("name", "is taken by another periodic schedule", row["name"])
    logger.info("schedule=%s event=periodic_created", row["name"])
    return new_id


def update_schedule(
    name: str,
    schedule: Schedule,
    *,
    enabled: bool,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> None:
    """Replace the definition and the switch of a schedule created in the admin (its name
    stays ``name``).

    Its next tick stays where it was unless its cadence (cron, interval, time zone) changed
    or it is turned on: then it starts from its first tick after ``now``. Raises
    ScheduleNotFound, ScheduleInCode (a schedule of the code: change the code), and
    InvalidSchedule / InvalidJob as ``resolve``.
    """
    now = now or dt.datetime.now(dt.UTC)
    row = resolve(replace(schedule, name=name), now)
    every = None if row["every_seconds"] is None else dt.timedelta(seconds=row["every_seconds"])
    db = queue_db(using)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        current = schedule_store.periodic_lock(cursor, name=name)
        if current is None:
            raise ScheduleNotFound(f"no periodic schedule is named {name!r}")
        if current.source != SOURCE_ADMIN:
            raise ScheduleInCode(f"periodic schedule {name!r} is declared in code: change it there")
        same_cadence = (current.cron, current.every, current.timezone) == (
            row["cron"],
            every,
            row["timezone"],
        )
        if same_cadence and (current.enabled or not enabled):
            row["next_run_at"] = current.next_run_at
        schedule_store.periodic_update(cursor, row=row, enabled=enabled)
    logger.info("schedule=%s event=periodic_changed", name)


def delete_schedule(name: str, *, using: str | None = None) -> None:
    """Delete a schedule created in the admin, or one code no longer declares (marked
    removed). Its jobs stay. Raises ScheduleNotFound, or ScheduleInCode for a schedule the
    code declares (the next start-up would bring it back: remove it from the code)."""
    db = queue_db(using)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        if not schedule_store.periodic_delete(cursor, name=name):
            if schedule_store.periodic_lock(cursor, name=name) is None:
                raise ScheduleNotFound(f"no periodic schedule is named {name!r}")
            raise ScheduleInCode(
                f"periodic schedule {name!r} is declared in code: remove it from the code"
            )
    logger.info("schedule=%s event=periodic_deleted", name)


def run_schedule_now(name: str, *, using: str | None = None, now: dt.datetime | None = None) -> int:
    """Enqueue one job of the schedule at once (the admin's "run now"); returns its id.

    The job is the one a tick would enqueue (task, payload, tenant, queue, priority,
    attempts; the fair clock charged), keyed ``run_now_key``. The schedule's row is not
    written: its next tick, last run and last job stay as they were. Works on a disabled
    schedule (the operator asked for this one run); refused for one removed from code, or
    whose task this process does not know (UnknownTask). Raises ScheduleNotFound.
    """
    now = now or dt.datetime.now(dt.UTC)
    db = queue_db(using)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        found = schedule_store.periodic_get(cursor, name=name)
        if found is None:
            raise ScheduleNotFound(f"no periodic schedule is named {name!r}")
        row, removed_at = found
        if removed_at is not None:
            raise InvalidSchedule("name", "was removed from code: it no longer runs", name)
        get_task(row.task)
        job_id = _enqueue_row(cursor, row, run_now_key(name, now))
    logger.info("schedule=%s event=periodic_run_now job=%s", name, job_id)
    return job_id


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
    one job, not one per missed tick; ``missed="skip"`` enqueues it only if on time. The
    next tick follows from the ticks' own series (cron or interval), never from ``now``
    plus a period, so a late run does not move the ones after it.
    """
    latest = last_due(row.cron, row.timezone, row.every, now)
    tick = latest if latest is not None and latest >= row.next_run_at else row.next_run_at
    if row.missed == "skip" and now - tick > MISSED_GRACE:
        tick = None
    return tick, next_due(row.cron, row.timezone, row.every, now)


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


def _enqueue_row(cursor: Any, row: schedule_store.DueSchedule, key: str) -> int | None:
    """Enqueue the schedule's job under ``key``; its id, or the id of the job that has the
    key already (nothing inserted, the tenant's clock refunded; None if since pruned).
    In a producer span (``pgqueue.tracing``): a tick of maintenance starts a trace of its
    own; "run now" continues the trace of the request that asked for it, if any."""
    with tracing.enqueue(
        row.task, queue=row.queue, tenant=row.tenant, schedule=row.name
    ) as sending:
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
            trace=sending.context,
        )
        sending.set(tracing.JOB_ID, ids[0].id if ids else None)
    if ids:
        return ids[0].id
    if charged:
        store.refund_clock(
            cursor,
            task=row.task,
            tenant=row.tenant,
            queue=row.queue,
            priority=row.priority,
            count=1,
        )
    return store.job_id_for_key(cursor, tenant=row.tenant, idempotency_key=key)


def _fire(cursor: Any, row: schedule_store.DueSchedule, now: dt.datetime) -> Fired:
    tick, next_run_at = plan(row, now)
    job_id = None if tick is None else _enqueue_row(cursor, row, tick_key(row.name, tick))
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
