"""Periodic jobs: declaring, syncing, one job per tick, missed ticks, DST, the admin.

The duty is driven with an injected clock (``enqueue_due(cur, now=...)``) on a dedicated
psycopg connection, as a worker's maintenance runs it, so nothing here sleeps until a
minute turns. The race with real ``runworker`` processes sets ``next_run_at`` in the past
instead. Tests that use a dedicated connection are transactional: it sees committed rows.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from django.core import checks as django_checks
from django.test import override_settings
from django.utils import timezone

import pgqueue
from pgqueue import schedules
from pgqueue.models import FairClock, Job, PeriodicSchedule
from pgqueue.schedules import Schedule, enqueue_due, set_periodic_enabled, sync_schedules
from pgqueue.worker.connection import connect, connect_params
from pgqueue.worker.maintenance import run_maintenance
from tests.workers import StartWorker, wait_for

UTC = dt.UTC
TASK = "test.periodic_tick"


def at(text: str) -> dt.datetime:
    """An instant from ISO text (``Z`` for UTC)."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def declared() -> Iterator[list[str]]:
    """Names appended here are undeclared after the test (the registry is process-wide)."""
    names: list[str] = []
    yield names
    for name in names:
        schedules.undeclare(name)


def declare(declared: list[str], name: str, cron: str, **options: object) -> Schedule:
    declared.append(name)
    return pgqueue.periodic(cron, task=TASK, name=name, **options)


@pytest.fixture
def duty_conn(transactional_db: None) -> Iterator[psycopg.Connection]:
    """A worker's kind of connection (psycopg, autocommit) to the test database."""
    conn = connect(connect_params(application_name="pgqueue test periodic"))
    yield conn
    conn.close()


def fire(conn: psycopg.Connection, now: dt.datetime) -> list[schedules.Fired]:
    """One run of the duty at ``now``, in its own transaction (as maintenance runs it)."""
    with conn.transaction(), conn.cursor() as cur:
        return enqueue_due(cur, now=now)


def jobs_of(name: str) -> list[Job]:
    return list(Job.objects.filter(idempotency_key__startswith=f"periodic:{name}:").order_by("id"))


def row(name: str) -> PeriodicSchedule:
    return PeriodicSchedule.objects.get(name=name)


# -- ticks and declarations (no database) ---------------------------------------------------


def test_ticks_are_computed_on_the_time_zones_wall_clock() -> None:
    # 09:00 every day in Paris is 08:00 UTC in winter and 07:00 UTC in summer.
    assert schedules.next_tick("0 9 * * *", "Europe/Paris", at("2026-01-10T12:00Z")) == at(
        "2026-01-11T08:00Z"
    )
    assert schedules.next_tick("0 9 * * *", "Europe/Paris", at("2026-07-10T12:00Z")) == at(
        "2026-07-11T07:00Z"
    )
    # Strictly after; last_tick is at or before.
    assert schedules.next_tick("*/5 * * * *", "UTC", at("2026-01-01T10:05Z")) == at(
        "2026-01-01T10:10Z"
    )
    assert schedules.last_tick("*/5 * * * *", "UTC", at("2026-01-01T10:05Z")) == at(
        "2026-01-01T10:05Z"
    )
    assert schedules.last_tick("*/5 * * * *", "UTC", at("2026-01-01T10:09:59Z")) == at(
        "2026-01-01T10:05Z"
    )


def test_the_tick_key_is_the_instant_in_utc() -> None:
    paris = dt.timezone(dt.timedelta(hours=2))
    tick = dt.datetime(2026, 3, 29, 3, 0, tzinfo=paris)
    assert schedules.tick_key("nightly", tick) == "periodic:nightly:2026-03-29T01:00:00Z"


@pytest.mark.django_db
def test_no_one_but_a_schedule_may_use_a_tick_key() -> None:
    """The tick keys are predictable: a tenant enqueueing first under one (a job of 300
    days' delay) would have the schedule take it for the tick's job, which would never
    run. Protection: the service layer refuses keys in the reserved namespace, which
    every tick key is in; the schedules enqueue through the store."""
    from pgqueue import services
    from tests.api_fixtures import assert_error, client, new_key

    key = schedules.tick_key("nightly", dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    assert key.startswith(services.RESERVED_KEY_PREFIX)
    with pytest.raises(pgqueue.InvalidJob) as exc:
        pgqueue.enqueue("test.echo", {}, tenant="acme", idempotency_key=key, delay=300 * 86400)
    assert exc.value.field == "idempotency_key"
    body = {"task": "test.echo", "idempotency_key": key, "delay_seconds": 300 * 86400}
    response = client(new_key("acme")).post("/jobs", body, format="json")
    assert_error(response, 400, field="idempotency_key")
    assert not Job.objects.exists()


def test_the_decorator_declares_a_schedule_for_the_task_and_returns_the_task(
    declared: list[str],
) -> None:
    declared.append("test.decorated")

    @pgqueue.periodic("*/5 * * * *", tenant="acme", payload={"n": 1}, missed="skip")
    @pgqueue.task(name="test.decorated")
    def decorated(payload, job):
        return payload

    try:
        assert isinstance(decorated, pgqueue.Task)
        (schedule,) = [s for s in schedules.declared_schedules() if s.name == "test.decorated"]
        assert schedule == Schedule(
            name="test.decorated",
            cron="*/5 * * * *",
            task="test.decorated",
            tenant="acme",
            payload={"n": 1},
            missed="skip",
        )
    finally:
        from pgqueue.registry import unregister

        unregister("test.decorated")


def test_the_decorator_needs_a_task_under_it() -> None:
    with pytest.raises(TypeError, match=r"above @pgqueue\.task"):
        pgqueue.periodic("* * * * *")(lambda payload, job: None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"cron": "* * * *"}, "invalid cron"),
        ({"missed": "all"}, "missed must be one of"),
        ({"timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"name": "has space"}, "invalid periodic schedule name"),
    ],
)
def test_a_bad_declaration_is_refused_at_once(options: dict, message: str) -> None:
    kwargs = {"cron": "* * * * *", "name": "bad", **options}
    cron = kwargs.pop("cron")
    with pytest.raises(ValueError, match=message):
        pgqueue.periodic(cron, task=TASK, **kwargs)
    assert "bad" not in {s.name for s in schedules.declared_schedules()}


def test_two_tasks_cannot_share_a_schedule_name(declared: list[str]) -> None:
    declare(declared, "shared", "* * * * *")
    with pytest.raises(ValueError, match="already used for task"):
        pgqueue.periodic("* * * * *", task="test.echo", name="shared")


def test_settings_declare_schedules_too() -> None:
    entry = {"cron": "0 3 * * *", "task": TASK, "tenant": "acme", "timezone": "Europe/Paris"}
    with override_settings(PGQUEUE={"PERIODIC": [entry]}):
        (schedule,) = schedules.declared_schedules()
    assert schedule.name == TASK  # the task's name by default
    assert (schedule.tenant, schedule.timezone, schedule.missed) == (
        "acme",
        "Europe/Paris",
        "run_once",
    )


# -- the system check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("periodic_setting", "message"),
    [
        ("hourly", "must be a list of dicts"),
        ([{"cron": "0 * * * *"}], "needs task"),
        ([{"cron": "0 * * * *", "task": TASK, "interval": 5}], "unknown key(s) interval"),
        ([{"cron": "0 * * * *", "task": TASK, "every": 5}], "cannot both be given"),
        ([{"task": TASK}], "needs cron or every"),
        ([{"cron": "0 * * * *", "task": "no.such.task"}], "no.such.task"),
        ([{"cron": "0 * * * *", "task": TASK, "tenant": "not a name"}], "tenant"),
        ([{"cron": "0 * * 13 *", "task": TASK}], "invalid cron"),
    ],
)
def test_the_check_reports_a_schedule_that_could_not_run(
    periodic_setting: object, message: str
) -> None:
    with override_settings(PGQUEUE={"PERIODIC": periodic_setting}):
        errors = [e for e in django_checks.run_checks() if e.id == "pgqueue.E004"]
    assert errors, "expected pgqueue.E004"
    assert message in errors[0].msg


def test_the_check_passes_good_schedules() -> None:
    entry = {"cron": "0 * * * *", "task": TASK, "tenant": "acme", "payload": {"a": 1}}
    with override_settings(PGQUEUE={"PERIODIC": [entry]}):
        assert [e for e in django_checks.run_checks() if e.id == "pgqueue.E004"] == []


# -- syncing ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_sync_copies_the_schedules_with_the_enqueue_defaults_and_their_first_tick(
    declared: list[str],
) -> None:
    declare(declared, "five", "*/5 * * * *", tenant="acme", payload={"x": [1, 2]})
    result = sync_schedules(now=at("2026-01-01T10:01Z"))
    assert result.declared == ["five"] and result.removed == []
    r = row("five")
    assert (r.cron, r.timezone, r.task, r.tenant) == ("*/5 * * * *", "UTC", TASK, "acme")
    # The task's queue, the default priority and attempts, as an enqueue would have them.
    assert (r.queue, r.priority, r.max_attempts) == ("periodic", 0, 5)
    assert r.payload == {"x": [1, 2]}
    assert (r.enabled, r.missed, r.removed_at) == (True, "run_once", None)
    assert r.next_run_at == at("2026-01-01T10:05Z")


@pytest.mark.django_db
def test_a_redeploy_keeps_the_operators_switch_and_the_next_tick(declared: list[str]) -> None:
    declare(declared, "five", "*/5 * * * *")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    assert set_periodic_enabled("five", False, now=at("2026-01-01T10:02Z"))
    sync_schedules(now=at("2026-01-01T10:17Z"))  # a later deploy of the same code
    r = row("five")
    assert r.enabled is False
    assert r.next_run_at == at("2026-01-01T10:05Z")


@pytest.mark.django_db
def test_a_changed_cron_restarts_from_its_own_next_tick(declared: list[str]) -> None:
    declare(declared, "sched", "*/5 * * * *")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    schedules.undeclare("sched")
    declare(declared, "sched", "0 * * * *")
    sync_schedules(now=at("2026-01-01T10:02Z"))
    assert row("sched").next_run_at == at("2026-01-01T11:00Z")


@pytest.mark.django_db
def test_sync_marks_a_schedule_gone_from_code_removed_and_brings_it_back(
    declared: list[str],
) -> None:
    declare(declared, "keep", "0 * * * *")
    declare(declared, "drop", "0 * * * *")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    schedules.undeclare("drop")
    assert sync_schedules(now=at("2026-01-01T10:02Z")).removed == ["drop"]
    assert row("drop").removed_at is not None and row("keep").removed_at is None
    declare(declared, "drop", "0 * * * *")
    sync_schedules(now=at("2026-01-01T13:30Z"))
    back = row("drop")
    assert back.removed_at is None
    assert back.next_run_at == at("2026-01-01T14:00Z")  # no catch-up of its time away


@pytest.mark.django_db
def test_the_schedule_time_zone_defaults_to_settings_time_zone(declared: list[str]) -> None:
    declare(declared, "nine", "0 9 * * *")
    with override_settings(TIME_ZONE="America/New_York"):
        sync_schedules(now=at("2026-01-10T12:00Z"))
    r = row("nine")
    assert r.timezone == "America/New_York"
    assert r.next_run_at == at("2026-01-10T14:00Z")  # 09:00 EST


# -- the duty: once per tick, missed ticks, the switch --------------------------------------


def test_a_due_schedule_enqueues_one_job_through_the_fair_enqueue(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    declare(declared, "five", "*/5 * * * *", tenant="acme", payload={"k": "v"})
    sync_schedules(now=at("2026-01-01T10:01Z"))
    assert fire(duty_conn, at("2026-01-01T10:04:59Z")) == []
    (fired,) = fire(duty_conn, at("2026-01-01T10:05:01Z"))
    (job,) = jobs_of("five")
    assert fired.tick == at("2026-01-01T10:05Z") and fired.job_id == job.id
    assert (job.task, job.tenant_id, job.queue, job.payload) == (
        TASK,
        "acme",
        "periodic",
        {"k": "v"},
    )
    assert job.status == "queued" and job.vtime is not None
    assert job.idempotency_key == "periodic:five:2026-01-01T10:05:00Z"
    assert FairClock.objects.filter(tenant_id="acme", queue="periodic").exists()  # charged
    r = row("five")
    assert (r.last_run_at, r.last_job_id) == (at("2026-01-01T10:05Z"), job.id)
    assert r.next_run_at == at("2026-01-01T10:10Z")
    assert fire(duty_conn, at("2026-01-01T10:06Z")) == []  # not due again before 10:10


def test_the_unique_key_holds_a_tick_to_one_job_even_when_next_run_at_is_set_back(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    """Defeats the compare-and-set on purpose: the tick's idempotency key still holds.

    Without the unique (tenant, idempotency_key) the second fire would insert a second job.
    """
    declare(declared, "five", "*/5 * * * *", tenant="acme")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    fire(duty_conn, at("2026-01-01T10:05:01Z"))
    (job,) = jobs_of("five")
    clock = FairClock.objects.get(tenant_id="acme", queue="periodic").vtime
    PeriodicSchedule.objects.filter(name="five").update(next_run_at=at("2026-01-01T10:05Z"))
    (again,) = fire(duty_conn, at("2026-01-01T10:06Z"))
    assert again.tick == at("2026-01-01T10:05Z") and again.job_id == job.id
    assert jobs_of("five") == [job]
    assert FairClock.objects.get(tenant_id="acme", queue="periodic").vtime == clock  # refunded


def test_missed_ticks_run_once_for_the_latest_when_a_worker_is_back(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    declare(declared, "five", "*/5 * * * *")
    sync_schedules(now=at("2026-01-01T10:01Z"))  # next 10:05; then no worker for 3 hours
    (fired,) = fire(duty_conn, at("2026-01-01T13:02Z"))
    assert fired.tick == at("2026-01-01T13:00Z")
    assert [j.idempotency_key for j in jobs_of("five")] == ["periodic:five:2026-01-01T13:00:00Z"]
    assert row("five").next_run_at == at("2026-01-01T13:05Z")
    assert fire(duty_conn, at("2026-01-01T13:03Z")) == []
    assert len(jobs_of("five")) == 1  # one job, not the 36 ticks missed


def test_missed_ticks_are_skipped_when_the_schedule_says_skip(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    declare(declared, "five", "*/5 * * * *", missed="skip")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    (fired,) = fire(duty_conn, at("2026-01-01T13:02Z"))  # 13:00 is 2 minutes late: missed
    assert fired.tick is None and jobs_of("five") == []
    r = row("five")
    assert (r.next_run_at, r.last_run_at, r.last_job_id) == (at("2026-01-01T13:05Z"), None, None)
    # A tick within the grace still runs: skip drops only what was missed.
    (on_time,) = fire(duty_conn, at("2026-01-01T13:05:30Z"))
    assert on_time.tick == at("2026-01-01T13:05Z")
    assert len(jobs_of("five")) == 1


def test_a_disabled_schedule_enqueues_nothing_and_restarts_from_its_next_tick(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    declare(declared, "five", "*/5 * * * *")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    assert set_periodic_enabled("five", False)
    assert not set_periodic_enabled("five", False)  # already off: nothing changed
    assert fire(duty_conn, at("2026-01-01T12:00:01Z")) == []
    assert jobs_of("five") == []
    assert set_periodic_enabled("five", True, now=at("2026-01-01T12:01Z"))
    assert row("five").next_run_at == at("2026-01-01T12:05Z")  # its time off was not missed
    assert fire(duty_conn, at("2026-01-01T12:04Z")) == []
    assert [f.tick for f in fire(duty_conn, at("2026-01-01T12:05:01Z"))] == [
        at("2026-01-01T12:05Z")
    ]


def test_the_switch_of_an_unknown_schedule_is_refused(transactional_db: None) -> None:
    with pytest.raises(schedules.ScheduleNotFound):
        set_periodic_enabled("nope", False)


def test_a_schedule_removed_from_code_stops(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    declare(declared, "five", "*/5 * * * *")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    schedules.undeclare("five")
    sync_schedules(now=at("2026-01-01T10:02Z"))
    assert fire(duty_conn, at("2026-01-01T11:00:01Z")) == []
    assert jobs_of("five") == []


def test_a_failing_schedule_costs_the_others_nothing(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    declare(declared, "broken", "*/5 * * * *")
    declare(declared, "fine", "*/5 * * * *")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    # A host without this zone, say: computing its ticks raises.
    PeriodicSchedule.objects.filter(name="broken").update(timezone="Mars/Olympus")
    failed: list[str] = []
    with duty_conn.transaction(), duty_conn.cursor() as cur:
        fired = enqueue_due(
            cur, now=at("2026-01-01T10:05:01Z"), on_error=lambda name, exc: failed.append(name)
        )
    assert failed == ["broken"] and [f.name for f in fired] == ["fine"]
    assert len(jobs_of("fine")) == 1 and jobs_of("broken") == []
    assert row("broken").next_run_at == at("2026-01-01T10:05Z")  # left due, tried again


def test_maintenance_runs_the_duty(declared: list[str], duty_conn: psycopg.Connection) -> None:
    declare(declared, "minutely", "* * * * *")
    sync_schedules()
    PeriodicSchedule.objects.filter(name="minutely").update(
        next_run_at=timezone.now() - dt.timedelta(minutes=3)
    )
    assert run_maintenance(duty_conn).ran
    assert len(jobs_of("minutely")) == 1
    assert row("minutely").next_run_at > timezone.now()


def test_racing_enqueuers_enqueue_each_tick_once(
    declared: list[str], transactional_db: None
) -> None:
    """Four connections fire the same ticks at the same instants, without the advisory lock
    of maintenance: one job per tick. Three guards hold it, each enough alone (checked by
    removing the others): the rows' FOR UPDATE SKIP LOCKED, the compare-and-set on
    next_run_at (its savepoint undoes the loser's enqueue) and the tick's unique key. With
    all three removed, each tick gets four jobs and this test fails."""
    declare(declared, "minutely", "* * * * *", tenant="acme")
    sync_schedules(now=at("2026-01-01T10:00:30Z"))
    ticks = [at("2026-01-01T10:01Z") + dt.timedelta(minutes=i) for i in range(8)]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def racer() -> None:
        conn = connect(connect_params(application_name="pgqueue test racer"))
        try:
            for tick in ticks:
                barrier.wait(timeout=30)
                fire(conn, tick + dt.timedelta(seconds=1))
        except Exception as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()
        finally:
            conn.close()

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    keys = Counter(j.idempotency_key for j in jobs_of("minutely"))
    assert keys == Counter({schedules.tick_key("minutely", t): 1 for t in ticks})


# -- DST: a daily 02:30 fires once on the days the clocks change --------------------------


@pytest.mark.parametrize(
    ("zone", "cron", "day", "expected"),
    [
        # Spring forward: 02:30 does not exist; it fires at the end of the gap, 03:00 CEST.
        ("Europe/Paris", "30 2 * * *", "2026-03-29", "2026-03-29T01:00Z"),
        # Fall back: 02:30 happens twice; it fires at the first, 02:30 CEST.
        ("Europe/Paris", "30 2 * * *", "2026-10-25", "2026-10-25T00:30Z"),
        # New York springs forward at 02:00: 02:30 fires at 03:00 EDT.
        ("America/New_York", "30 2 * * *", "2026-03-08", "2026-03-08T07:00Z"),
        # New York falls back at 02:00 (01:00-02:00 repeats): 01:30 fires at 01:30 EDT.
        ("America/New_York", "30 1 * * *", "2026-11-01", "2026-11-01T05:30Z"),
    ],
)
def test_a_daily_schedule_fires_once_on_a_dst_day_at_the_documented_instant(
    declared: list[str],
    duty_conn: psycopg.Connection,
    zone: str,
    cron: str,
    day: str,
    expected: str,
) -> None:
    declare(declared, "nightly", cron)
    midnight = dt.datetime.fromisoformat(day).replace(tzinfo=schedules.zone(zone))
    with override_settings(TIME_ZONE=zone):
        sync_schedules(now=midnight.astimezone(UTC))
    # Every 5 minutes of that local day (23 or 25 hours of it), as maintenance would.
    now = midnight.astimezone(UTC)
    end = (midnight + dt.timedelta(days=1)).astimezone(UTC)
    while now < end:
        now += dt.timedelta(minutes=5)
        fire(duty_conn, now)
    assert [j.idempotency_key for j in jobs_of("nightly")] == [
        schedules.tick_key("nightly", at(expected))
    ]
    assert row("nightly").last_run_at == at(expected)


def test_an_hourly_schedule_keeps_its_pace_through_the_repeated_hour() -> None:
    """Debian cron's rule, which cronsim follows: only schedules coarser than an hour get the
    once-only treatment; an hourly one runs in both 02:00 hours of the fall-back day."""
    ticks, now = [], at("2026-10-24T22:30Z")  # 00:30 CEST on 2026-10-25
    for _ in range(4):
        now = schedules.next_tick("0 * * * *", "Europe/Paris", now)
        ticks.append(now)
    # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET: one each real hour.
    assert ticks == [at(t) for t in ("2026-10-24T23:00Z", "2026-10-25T00:00Z")] + [
        at(t) for t in ("2026-10-25T01:00Z", "2026-10-25T02:00Z")
    ]


# -- real workers -------------------------------------------------------------------------

SCHEDULE = {"name": "every-minute", "cron": "* * * * *", "task": TASK, "tenant": "acme"}


def test_four_racing_workers_enqueue_one_job_per_tick(workers: StartWorker) -> None:
    """Four runworker processes sync the same schedule at start-up and run maintenance every
    0.1 s; each time next_run_at is put in the past, exactly one job is enqueued for it."""
    settings = {"PERIODIC": [SCHEDULE], "MAINTENANCE_SECONDS": 0.1}
    started = [workers("--queues", "periodic", settings=settings) for _ in range(4)]
    for w in started:
        w.registered()
    assert PeriodicSchedule.objects.filter(name="every-minute", removed_at=None).count() == 1

    for _ in range(3):
        past = timezone.now() - dt.timedelta(minutes=10)
        PeriodicSchedule.objects.filter(name="every-minute").update(next_run_at=past)
        wait_for(
            lambda: row("every-minute").next_run_at > timezone.now(),
            20,
            "a worker to fire the schedule and move it to its next tick",
        )
    jobs = jobs_of("every-minute")
    keys = Counter(j.idempotency_key for j in jobs)
    assert jobs and set(keys.values()) == {1}, keys
    # The latest tick's job is the one the row points at, and a worker runs it.
    assert row("every-minute").last_job_id == jobs[-1].id
    wait_for(
        lambda: Job.objects.filter(id=jobs[-1].id, status="done").exists(),
        20,
        "the periodic job to be run",
    )
    for w in started:
        assert "periodic_failed" not in w.log()


def test_a_worker_started_without_the_schedule_removes_it(workers: StartWorker) -> None:
    first = workers(settings={"PERIODIC": [SCHEDULE]})
    first.registered()
    assert row("every-minute").removed_at is None
    second = workers(settings={"PERIODIC": []})
    second.registered()
    assert row("every-minute").removed_at is not None


# -- the admin ----------------------------------------------------------------------------

ADMIN = "/admin/pgqueue/periodicschedule/"


@pytest.mark.django_db
def test_the_admin_lists_schedules_with_their_last_job_and_toggles_them(
    admin_client, declared: list[str]
) -> None:
    declare(declared, "five", "*/5 * * * *", tenant="acme")
    sync_schedules()
    job, _ = pgqueue.enqueue(TASK, {}, tenant="acme")
    PeriodicSchedule.objects.filter(name="five").update(
        last_job_id=job.id, last_run_at=timezone.now()
    )
    response = admin_client.get(ADMIN)
    assert response.status_code == 200
    page = response.content.decode()
    assert "five" in page and "*/5 * * * *" in page and "enabled" in page
    assert f'href="/admin/pgqueue/job/{job.id}/change/"' in page

    pk = row("five").pk
    response = admin_client.post(
        ADMIN, {"action": "disable", "_selected_action": [pk]}, follow=True
    )
    assert "Disabled 1 schedule(s)." in response.content.decode()
    assert row("five").enabled is False
    admin_client.post(ADMIN, {"action": "enable", "_selected_action": [pk]})
    assert row("five").enabled is True
    # A schedule's own page is read-only: code owns it (tests/test_schedules_admin.py has
    # the schedules created in the admin).
    assert admin_client.post(f"{ADMIN}{pk}/change/", {"enabled": ""}).status_code == 403


def test_pgqueue_exports_the_decorator() -> None:
    assert pgqueue.periodic is schedules.periodic
    assert "periodic" in pgqueue.__all__
