"""Interval schedules (``every=``) beside cron ones, and schedules created, changed, switched,
deleted and run at once from the admin.

As in tests/test_periodic.py, the maintenance duty is driven with an injected clock on a
worker's kind of connection (``fire``), and real ``runworker`` processes race over the same
schedules. The admin is driven through Django's test client as a logged-in superuser
(``admin_client``); every state change is checked in the rows as well as on the page.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.contrib.messages import get_messages
from django.core import checks as django_checks
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

import pgqueue
from pgqueue import schedules
from pgqueue.exceptions import InvalidJob
from pgqueue.models import Job, PeriodicSchedule
from pgqueue.schedules import Schedule, create_schedule, run_schedule_now, sync_schedules
from pgqueue.worker.connection import connect, connect_params
from tests.test_periodic import TASK, at, fire, jobs_of, row
from tests.workers import StartWorker, wait_for

ADMIN = "/admin/pgqueue/periodicschedule/"
FIVE = dt.timedelta(minutes=5)


@pytest.fixture
def declared() -> Iterator[list[str]]:
    """Names appended here are undeclared after the test (the registry is process-wide)."""
    names: list[str] = []
    yield names
    for name in names:
        schedules.undeclare(name)


@pytest.fixture
def duty_conn(transactional_db: None) -> Iterator[psycopg.Connection]:
    """A worker's kind of connection (psycopg, autocommit) to the test database."""
    conn = connect(connect_params(application_name="pgqueue test schedules"))
    yield conn
    conn.close()


def change_url(name: str) -> str:
    return f"{ADMIN}{row(name).pk}/change/"


def tick_of(name: str, key: str) -> dt.datetime:
    """The tick a job's idempotency key names (``periodic:<name>:<tick>``)."""
    return at(key.removeprefix(f"periodic:{name}:"))


def admin_schedule(name: str, **options: Any) -> PeriodicSchedule:
    """A schedule created as the admin's add page creates one (``create_schedule``)."""
    options.setdefault("every", FIVE)
    enabled = options.pop("enabled", True)
    now = options.pop("now", None)
    create_schedule(Schedule(name=name, task=TASK, **options), enabled=enabled, now=now)
    return row(name)


# -- interval ticks (no database) -----------------------------------------------------------


def test_interval_ticks_are_the_multiples_of_the_interval_since_the_epoch() -> None:
    assert schedules.next_due(None, "UTC", FIVE, at("2026-01-01T10:01Z")) == at("2026-01-01T10:05Z")
    # Strictly after, as for cron; the latest tick is at or before.
    assert schedules.next_due(None, "UTC", FIVE, at("2026-01-01T10:05Z")) == at("2026-01-01T10:10Z")
    assert schedules.last_due(None, "UTC", FIVE, at("2026-01-01T10:05Z")) == at("2026-01-01T10:05Z")
    assert schedules.last_due(None, "UTC", FIVE, at("2026-01-01T10:09:59Z")) == at(
        "2026-01-01T10:05Z"
    )
    ninety = dt.timedelta(minutes=90)
    assert schedules.next_due(None, "UTC", ninety, at("2026-01-01T00:10Z")) == at(
        "2026-01-01T01:30Z"
    )
    # A week: 1970-01-01 was a Thursday, and so is 2026-01-01.
    week = dt.timedelta(days=7)
    assert schedules.next_due(None, "UTC", week, at("2026-01-01T12:00Z")) == at("2026-01-08T00:00Z")
    # The time zone plays no part in an interval's ticks.
    assert schedules.next_due(None, "Europe/Paris", FIVE, at("2026-01-01T10:01Z")) == at(
        "2026-01-01T10:05Z"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("30s", 30), ("5m", 300), ("1h 30m", 5400), ("2d", 172800), ("1D 2H", 93600),
     ("01:30:00", 5400), ("PT5M", 300)],
)  # fmt: skip
def test_intervals_typed_by_a_person_read_as_seconds(text: str, seconds: int) -> None:
    every = schedules.parse_every(text)
    assert every == dt.timedelta(seconds=seconds)
    assert schedules.parse_every(schedules.format_every(every)) == every


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "5m5h", "-5m", "99999999999999999d"])
def test_an_interval_that_does_not_read_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        schedules.parse_every(text)


# -- declaring interval schedules -----------------------------------------------------------


def test_every_declares_an_interval_schedule_as_a_timedelta(declared: list[str]) -> None:
    declared.extend(["by-delta", "by-seconds"])
    pgqueue.periodic(every=FIVE, task=TASK, name="by-delta", tenant="acme")
    pgqueue.periodic(every=300, task=TASK, name="by-seconds")
    found = {s.name: s for s in schedules.declared_schedules()}
    assert found["by-delta"] == Schedule(name="by-delta", task=TASK, every=FIVE, tenant="acme")
    assert (found["by-seconds"].every, found["by-seconds"].cron) == (FIVE, None)


def test_every_stacks_on_a_task_like_a_cron(declared: list[str]) -> None:
    declared.append("test.every_decorated")

    @pgqueue.periodic(every=dt.timedelta(hours=1))
    @pgqueue.task(name="test.every_decorated")
    def decorated(payload, job):
        return payload

    try:
        assert isinstance(decorated, pgqueue.Task)
        (schedule,) = [s for s in schedules.declared_schedules() if s.task == decorated.name]
        assert schedule.every == dt.timedelta(hours=1)
    finally:
        from pgqueue.registry import unregister

        unregister("test.every_decorated")


def test_settings_declare_interval_schedules_in_seconds() -> None:
    entry = {"name": "settings-every", "every": 90, "task": TASK, "tenant": "acme"}
    with override_settings(PGQUEUE={"PERIODIC": [entry]}):
        (schedule,) = schedules.declared_schedules()
    assert (schedule.every, schedule.cron, schedule.timezone) == (
        dt.timedelta(seconds=90),
        None,
        None,
    )


@pytest.mark.parametrize(
    ("options", "field", "reason"),
    [
        ({"cron": "* * * * *", "every": 60}, "every", "cannot both be given"),
        ({}, "cron", "or every is needed"),
        ({"every": 1.5}, "every", "whole number of seconds, got 1.5 s"),
        ({"every": dt.timedelta(milliseconds=500)}, "every", "whole number of seconds"),
        ({"every": 0}, "every", "at least 1 s (PGQUEUE['PERIODIC_MIN_INTERVAL_SECONDS'])"),
        ({"every": -60}, "every", "at least 1 s"),
        ({"every": dt.timedelta(days=366)}, "every", "at most 365d"),
        ({"every": 1e30}, "every", "at most 365d"),
        ({"every": "5m"}, "every", "a datetime.timedelta or a number of seconds"),
        ({"every": True}, "every", "a datetime.timedelta or a number of seconds"),
        ({"every": 60, "timezone": "Europe/Paris"}, "timezone", "cron schedules only"),
    ],
)
def test_a_bad_interval_declaration_is_refused_naming_the_field(
    options: dict, field: str, reason: str
) -> None:
    with pytest.raises(schedules.InvalidSchedule) as exc:
        pgqueue.periodic(task=TASK, name="bad-every", **options)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, InvalidJob)
    assert exc.value.field == field and reason in exc.value.reason
    assert str(exc.value).startswith(f"schedule 'bad-every': {field} ")
    assert "bad-every" not in {s.name for s in schedules.declared_schedules()}


def test_the_shortest_interval_is_a_setting(declared: list[str]) -> None:
    with override_settings(PGQUEUE={"PERIODIC_MIN_INTERVAL_SECONDS": 60}):
        with pytest.raises(schedules.InvalidSchedule, match=r"at least 60 s .*got 30 s"):
            pgqueue.periodic(every=30, task=TASK, name="too-often")
        declared.append("once-a-minute")
        pgqueue.periodic(every=60, task=TASK, name="once-a-minute")


@pytest.mark.parametrize(
    ("value", "message"), [(0, ">= 1"), (1.5, "an integer"), ("1", "an integer")]
)
def test_the_check_refuses_a_shortest_interval_below_a_second(value: Any, message: str) -> None:
    with override_settings(PGQUEUE={"PERIODIC_MIN_INTERVAL_SECONDS": value}):
        errors = [e.msg for e in django_checks.run_checks() if e.id == "pgqueue.E003"]
    assert any("PERIODIC_MIN_INTERVAL_SECONDS" in m and message in m for m in errors), errors


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"every": 0.5, "task": TASK}, "whole number of seconds"),
        ({"every": 10 * 365 * 86400, "task": TASK}, "at most 365d"),
        ({"every": 60, "task": TASK, "timezone": "UTC"}, "cron schedules only"),
    ],
)
def test_the_check_reports_an_interval_schedule_that_could_not_run(
    entry: dict, message: str
) -> None:
    with override_settings(PGQUEUE={"PERIODIC": [entry]}):
        errors = [e.msg for e in django_checks.run_checks() if e.id == "pgqueue.E004"]
    assert errors and message in errors[0], errors


# -- syncing and firing interval schedules ------------------------------------------------


@pytest.mark.django_db
def test_sync_stores_an_interval_schedule_with_its_first_tick(declared: list[str]) -> None:
    declared.append("every-five")
    pgqueue.periodic(every=FIVE, task=TASK, name="every-five", tenant="acme")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    r = row("every-five")
    assert (r.cron, r.every, r.timezone, r.source) == (None, FIVE, "UTC", "code")
    assert r.next_run_at == at("2026-01-01T10:05Z")
    sync_schedules(now=at("2026-01-01T10:03Z"))  # a redeploy keeps the next tick
    assert row("every-five").next_run_at == at("2026-01-01T10:05Z")
    schedules.undeclare("every-five")
    pgqueue.periodic(every=dt.timedelta(hours=1), task=TASK, name="every-five")
    sync_schedules(now=at("2026-01-01T10:04Z"))  # a new interval restarts from its own tick
    assert (row("every-five").every, row("every-five").next_run_at) == (
        dt.timedelta(hours=1),
        at("2026-01-01T11:00Z"),
    )
    schedules.undeclare("every-five")
    pgqueue.periodic("30 * * * *", task=TASK, name="every-five")
    sync_schedules(now=at("2026-01-01T10:05Z"))  # interval to cron: the CHECK holds
    assert (row("every-five").cron, row("every-five").every) == ("30 * * * *", None)
    assert row("every-five").next_run_at == at("2026-01-01T10:30Z")


def test_an_interval_schedule_fires_each_tick_once_without_drift(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    """The next tick follows from the series, not from when maintenance ran: a run 2.5
    minutes late fires the tick it missed and keeps the next one on the 5-minute grid."""
    declared.append("every-five")
    pgqueue.periodic(every=FIVE, task=TASK, name="every-five", tenant="acme", payload={"k": 1})
    sync_schedules(now=at("2026-01-01T10:01Z"))
    assert fire(duty_conn, at("2026-01-01T10:04:59Z")) == []
    (fired,) = fire(duty_conn, at("2026-01-01T10:05:01Z"))
    assert (fired.tick, fired.next_run_at) == (at("2026-01-01T10:05Z"), at("2026-01-01T10:10Z"))
    assert fire(duty_conn, at("2026-01-01T10:09:59Z")) == []
    (late,) = fire(duty_conn, at("2026-01-01T10:12:30Z"))
    assert (late.tick, late.next_run_at) == (at("2026-01-01T10:10Z"), at("2026-01-01T10:15Z"))
    (on_time,) = fire(duty_conn, at("2026-01-01T10:15:00.5Z"))
    assert on_time.tick == at("2026-01-01T10:15Z")
    jobs = jobs_of("every-five")
    assert [tick_of("every-five", j.idempotency_key) for j in jobs] == [
        at("2026-01-01T10:05Z"), at("2026-01-01T10:10Z"), at("2026-01-01T10:15Z")
    ]  # fmt: skip
    assert {(j.task, j.tenant_id, j.queue, json.dumps(j.payload)) for j in jobs} == {
        (TASK, "acme", "periodic", '{"k": 1}')
    }
    assert (row("every-five").last_run_at, row("every-five").last_job_id) == (
        at("2026-01-01T10:15Z"),
        jobs[-1].id,
    )


@pytest.mark.parametrize(
    ("missed", "expected"), [("run_once", ["2026-01-01T13:00:00Z"]), ("skip", [])]
)
def test_after_downtime_an_interval_schedule_runs_once_or_skips(
    declared: list[str], duty_conn: psycopg.Connection, missed: str, expected: list[str]
) -> None:
    """Three hours without a worker (36 ticks): one catch-up job for the latest tick with
    run_once, none with skip (13:00 is two minutes late); either way the next is 13:05."""
    declared.append("every-five")
    pgqueue.periodic(every=FIVE, task=TASK, name="every-five", missed=missed)
    sync_schedules(now=at("2026-01-01T10:01Z"))
    (fired,) = fire(duty_conn, at("2026-01-01T13:02Z"))
    assert fired.next_run_at == at("2026-01-01T13:05Z")
    assert [j.idempotency_key for j in jobs_of("every-five")] == [
        f"periodic:every-five:{tick}" for tick in expected
    ]
    assert fire(duty_conn, at("2026-01-01T13:04Z")) == []


def test_racing_enqueuers_enqueue_each_interval_tick_once(
    declared: list[str], transactional_db: None
) -> None:
    """Four connections fire an interval schedule at the same instants, without the
    advisory lock of maintenance: one job per tick, as for cron (the same three guards:
    FOR UPDATE SKIP LOCKED, the compare-and-set on next_run_at, the tick's unique key;
    tests/test_periodic.py shows each is enough alone). With all three removed, the eight
    ticks get 32 jobs and this test fails."""
    declared.append("half-minute")
    pgqueue.periodic(every=30, task=TASK, name="half-minute", tenant="acme")
    sync_schedules(now=at("2026-01-01T10:00:10Z"))
    ticks = [at("2026-01-01T10:00:30Z") + i * dt.timedelta(seconds=30) for i in range(8)]
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
    keys = Counter(j.idempotency_key for j in jobs_of("half-minute"))
    assert keys == Counter({schedules.tick_key("half-minute", t): 1 for t in ticks})


def test_three_workers_fire_code_and_admin_interval_schedules_once_per_tick(
    workers: StartWorker,
) -> None:
    """Three runworker processes, maintenance every 0.1 s, two one-second schedules: one in
    their settings, one created in the admin before they start (their start-up sync must
    leave it alone). Every tick enqueued is a whole second, at most one job each, the
    series has no tick twice, and the rows point at their latest tick's job, which runs."""
    admin_schedule("admin-every-second", every=1, tenant="acme")
    code = {"name": "code-every-second", "every": 1, "task": TASK, "tenant": "acme"}
    settings = {"PERIODIC": [code], "MAINTENANCE_SECONDS": 0.1}
    started = [workers("--queues", "periodic", settings=settings) for _ in range(3)]
    for w in started:
        w.registered()
    names = ["code-every-second", "admin-every-second"]
    assert [(row(n).source, row(n).removed_at) for n in names] == [("code", None), ("admin", None)]

    def ticks(name: str) -> list[dt.datetime]:
        return [tick_of(name, j.idempotency_key) for j in jobs_of(name)]

    for name in names:
        wait_for(lambda n=name: len(ticks(n)) >= 4, 30, f"four ticks of {name}")
    for name in names:
        fired = ticks(name)
        assert len(fired) == len(set(fired)), fired
        assert fired == sorted(fired)  # enqueued in tick order: the schedule moved forward
        assert all(t.microsecond == 0 for t in fired)
        latest = jobs_of(name)[-1]
        wait_for(
            lambda n=name, j=latest: row(n).last_job_id >= j.id, 10, f"{name}'s row to catch up"
        )
        wait_for(
            lambda j=latest: Job.objects.filter(id=j.id, status="done").exists(),
            20,
            f"a job of {name} to be run",
        )
    for w in started:
        assert "periodic_failed" not in w.log()


# -- the service layer: the admin's schedules beside the code's ------------------------------


@pytest.mark.django_db
def test_a_sync_leaves_admin_schedules_alone_until_code_takes_a_name(
    declared: list[str],
) -> None:
    admin_schedule("mine", now=at("2026-01-01T10:01Z"), payload={"from": "admin"})
    admin_schedule("shared", now=at("2026-01-01T10:01Z"))
    result = sync_schedules(now=at("2026-01-01T10:02Z"))  # the code declares none
    assert (result.removed, result.taken) == ([], [])
    assert row("mine").removed_at is None and row("mine").next_run_at == at("2026-01-01T10:05Z")
    # A worker of an earlier version, whose sync knew no source, would mark it removed:
    # the next sync of this version brings it back.
    PeriodicSchedule.objects.filter(name="mine").update(removed_at=timezone.now())
    sync_schedules(now=at("2026-01-01T10:02:30Z"))
    assert row("mine").removed_at is None and row("mine").next_run_at == at("2026-01-01T10:05Z")

    declared.append("shared")
    pgqueue.periodic("0 * * * *", task=TASK, name="shared", payload={"from": "code"})
    result = sync_schedules(now=at("2026-01-01T10:03Z"))
    assert (result.declared, result.removed, result.taken) == (["shared"], [], ["shared"])
    taken = row("shared")
    assert (taken.source, taken.cron, taken.every, taken.payload) == (
        "code", "0 * * * *", None, {"from": "code"}
    )  # fmt: skip
    assert taken.next_run_at == at("2026-01-01T11:00Z")
    assert row("mine").source == "admin" and row("mine").payload == {"from": "admin"}
    with pytest.raises(schedules.ScheduleInCode):
        schedules.update_schedule(
            "shared", Schedule(name="shared", task=TASK, every=60), enabled=True
        )
    with pytest.raises(schedules.ScheduleInCode):
        schedules.delete_schedule("shared")
    with pytest.raises(schedules.ScheduleNotFound):
        schedules.delete_schedule("nope")


@pytest.mark.django_db
def test_an_admin_schedule_may_not_take_a_name_of_the_code(declared: list[str]) -> None:
    declared.append("coded")
    pgqueue.periodic("0 * * * *", task=TASK, name="coded")
    with pytest.raises(schedules.InvalidSchedule, match="declared in code") as exc:
        admin_schedule("coded")
    assert exc.value.field == "name"
    entry = {"name": "from-settings", "every": 60, "task": TASK}
    with (
        override_settings(PGQUEUE={"PERIODIC": [entry]}),
        pytest.raises(schedules.InvalidSchedule, match="declared in code"),
    ):
        admin_schedule("from-settings")
    admin_schedule("free")
    with pytest.raises(schedules.InvalidSchedule, match="is taken") as exc:
        admin_schedule("free")
    assert exc.value.field == "name"


def test_run_now_enqueues_one_job_and_leaves_the_next_tick(
    declared: list[str], duty_conn: psycopg.Connection
) -> None:
    """The operator's extra run is its own job (its own key): the tick due next is still
    enqueued when it comes, and the row's next run, last run and last job are untouched."""
    admin_schedule("every-five", now=at("2026-01-01T10:01Z"), tenant="acme", payload={"n": 1})
    (first,) = fire(duty_conn, at("2026-01-01T10:05:01Z"))
    before = row("every-five")
    job_id = run_schedule_now("every-five", now=at("2026-01-01T10:06:00.123456Z"))
    job = Job.objects.get(id=job_id)
    assert job.idempotency_key == "periodic:every-five:now:2026-01-01T10:06:00.123456Z"
    assert (job.task, job.tenant_id, job.queue, job.payload, job.status) == (
        TASK, "acme", "periodic", {"n": 1}, "queued"
    )  # fmt: skip
    after = row("every-five")
    assert (after.next_run_at, after.last_run_at, after.last_job_id, after.updated_at) == (
        before.next_run_at, before.last_run_at, before.last_job_id, before.updated_at
    )  # fmt: skip
    assert after.next_run_at == at("2026-01-01T10:10Z")
    (due,) = fire(duty_conn, at("2026-01-01T10:10:01Z"))
    assert due.tick == at("2026-01-01T10:10Z")
    assert [j.id for j in jobs_of("every-five")] == [first.job_id, job_id, due.job_id]


# -- the admin ----------------------------------------------------------------------------


def form(**fields: Any) -> dict[str, str]:
    """The add or change form as a browser posts it; ``enabled=None`` leaves it unticked."""
    data: dict[str, Any] = {
        "name": "nightly", "task": TASK, "cron": "", "every": "5m", "timezone": "",
        "payload": "", "tenant": "acme", "queue": "", "priority": "", "max_attempts": "",
        "missed": "run_once", "enabled": "on", "_save": "Save",
    }  # fmt: skip
    data.update(fields)
    return {k: v for k, v in data.items() if v is not None}


def form_errors(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 200, response.status_code  # the form again, not a 500
    return {k: list(v) for k, v in response.context["adminform"].form.errors.items()}


def message_texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def act(client: Any, action: str, names: list[str]) -> Any:
    ids = [str(row(n).pk) for n in names]
    return client.post(ADMIN, {"action": action, "_selected_action": ids}, follow=True)


@pytest.mark.django_db
def test_the_admin_adds_a_cron_schedule_with_the_tasks_defaults(admin_client) -> None:
    page = admin_client.get(f"{ADMIN}add/")
    assert page.status_code == 200
    assert f'<option value="{TASK}">' in page.content.decode()  # the tasks to choose from
    before = timezone.now()
    response = admin_client.post(
        f"{ADMIN}add/",
        form(cron="30 2 * * *", every="", timezone="Europe/Paris", payload='{"k": [1, 2]}'),
    )
    assert response.status_code == 302, form_errors(response)
    r = row("nightly")
    assert (r.source, r.cron, r.every, r.timezone, r.enabled) == (
        "admin", "30 2 * * *", None, "Europe/Paris", True
    )  # fmt: skip
    # Empty fields took the task's defaults, as an enqueue's do.
    assert (r.task, r.tenant, r.queue, r.priority, r.max_attempts) == (
        TASK, "acme", "periodic", 0, 5
    )  # fmt: skip
    assert r.payload == {"k": [1, 2]} and r.missed == "run_once"
    assert r.next_run_at == schedules.next_tick("30 2 * * *", "Europe/Paris", before)


@pytest.mark.django_db
def test_the_admin_adds_an_interval_schedule(admin_client) -> None:
    response = admin_client.post(
        f"{ADMIN}add/",
        form(name="ninety", every="1h 30m", enabled=None, priority="7", missed="skip"),
    )
    assert response.status_code == 302, form_errors(response)
    r = row("ninety")
    assert (r.cron, r.every, r.timezone, r.enabled) == (
        None,
        dt.timedelta(minutes=90),
        "UTC",
        False,
    )
    assert (r.priority, r.missed, r.source) == (7, "skip", "admin")
    assert r.next_run_at > timezone.now() - dt.timedelta(seconds=5)
    assert (r.next_run_at - schedules.EPOCH) % dt.timedelta(minutes=90) == dt.timedelta(0)
    listing = admin_client.get(ADMIN).content.decode()
    assert "every 1h 30m" in listing and ">admin<" in listing


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({"cron": "61 * * * *", "every": ""}, "cron", "not a valid cron expression"),
        ({"cron": "", "every": ""}, "cron", "or every is needed"),
        ({"cron": "* * * * *", "every": "5m"}, "every", "cannot both be given"),
        ({"every": "0s"}, "every", "at least 1 s"),
        ({"every": "366d"}, "every", "at most 365d"),
        ({"every": "1.5"}, "every", "whole number of seconds"),
        ({"every": "soon"}, "every", "such as"),
        ({"every": "5m", "timezone": "Europe/Paris"}, "timezone", "cron schedules only"),
        ({"cron": "0 * * * *", "every": "", "timezone": "Mars/Olympus"}, "timezone", "unknown"),
        ({"task": "no.such.task"}, "task", "Select a valid choice"),
        ({"payload": "{not json"}, "payload", "valid JSON"),
        ({"payload": "[" * 50_000}, "payload", ""),
        ({"payload": "NaN"}, "payload", "not JSON-serialisable"),
        ({"tenant": "not a name"}, "tenant", "must match"),
        ({"queue": "bad queue"}, "queue", "must match"),
        ({"priority": "500"}, "priority", "from -100 to 100"),
        ({"max_attempts": "0"}, "max_attempts", "from 1 to 100"),
        ({"name": "has space"}, "name", "1 to 150 characters"),
        ({"missed": "all"}, "missed", "Select a valid choice"),
    ],
)
def test_the_admin_shows_what_the_service_refuses_on_the_field(
    admin_client, fields: dict, field: str, text: str
) -> None:
    response = admin_client.post(f"{ADMIN}add/", form(**fields))
    errors = form_errors(response)
    assert field in errors and text in " ".join(errors[field]), errors
    assert not PeriodicSchedule.objects.exists()


@pytest.mark.django_db
def test_a_bad_interval_beside_a_bad_payload_is_still_an_error_on_its_field(admin_client):
    """With the payload refused first, the service never sees the interval: the field
    checks its own bounds, so "0s" is an error on ``every``, not a message about a database
    constraint at the top of the page."""
    errors = form_errors(admin_client.post(f"{ADMIN}add/", form(every="0s", payload="{x")))
    assert "at least 1 s" in " ".join(errors["every"]), errors
    assert "valid JSON" in " ".join(errors["payload"])
    assert not any("onstraint" in " ".join(v) for v in errors.values()), errors


@pytest.mark.django_db
def test_the_admin_refuses_a_payload_over_the_limit_and_a_taken_name(
    admin_client, declared: list[str]
) -> None:
    with override_settings(PGQUEUE={"MAX_PAYLOAD_BYTES": 64}):
        errors = form_errors(admin_client.post(f"{ADMIN}add/", form(payload=json.dumps("x" * 100))))
    assert "more than the limit of 64" in " ".join(errors["payload"])
    admin_schedule("nightly")
    errors = form_errors(admin_client.post(f"{ADMIN}add/", form()))
    assert "already exists" in " ".join(errors["name"])
    declared.append("coded")
    pgqueue.periodic("0 * * * *", task=TASK, name="coded")
    errors = form_errors(admin_client.post(f"{ADMIN}add/", form(name="coded")))
    assert "declared in code" in " ".join(errors["name"])
    assert list(PeriodicSchedule.objects.values_list("name", flat=True)) == ["nightly"]


@pytest.mark.django_db
def test_the_admin_edits_a_schedule_keeping_its_next_run_unless_its_cadence_changes(
    admin_client,
) -> None:
    admin_schedule("nightly", payload={"v": 1}, tenant="acme")
    before = row("nightly")
    page = admin_client.get(change_url("nightly")).content.decode()
    assert 'value="5m"' in page  # the interval as it is typed
    assert "A schedule created here is yours to change or delete" in page

    response = admin_client.post(change_url("nightly"), form(payload='{"v": 2}', queue="reports"))
    assert response.status_code == 302, form_errors(response)
    r = row("nightly")
    assert (r.payload, r.queue, r.next_run_at) == ({"v": 2}, "reports", before.next_run_at)

    changed_at = timezone.now()
    response = admin_client.post(change_url("nightly"), form(every="", cron="0 3 * * *"))
    assert response.status_code == 302, form_errors(response)
    r = row("nightly")
    assert (r.cron, r.every) == ("0 3 * * *", None)
    assert r.next_run_at == schedules.next_tick("0 3 * * *", None, changed_at)

    response = admin_client.post(
        change_url("nightly"), form(every="", cron="0 3 * * *", enabled=None)
    )
    assert response.status_code == 302 and row("nightly").enabled is False
    # A bad edit is a form error and changes nothing.
    errors = form_errors(
        admin_client.post(change_url("nightly"), form(every="1s", cron="* * * * *"))
    )
    assert "cannot both be given" in " ".join(errors["every"])
    assert row("nightly").cron == "0 3 * * *"


@pytest.mark.django_db
def test_the_admin_switches_schedules_off_and_on(admin_client, declared: list[str]) -> None:
    admin_schedule("mine")
    declared.append("coded")
    pgqueue.periodic("0 * * * *", task=TASK, name="coded")
    sync_schedules()
    response = act(admin_client, "disable", ["mine", "coded"])
    assert "Disabled 2 schedule(s)." in message_texts(response)
    assert [row(n).enabled for n in ("mine", "coded")] == [False, False]
    response = act(admin_client, "enable", ["mine"])
    assert "Enabled 1 schedule(s)." in message_texts(response)
    assert row("mine").enabled is True
    assert row("mine").next_run_at > timezone.now()  # from its next tick, not the ones passed


@pytest.mark.django_db
def test_the_admins_run_now_enqueues_one_job_per_schedule(
    admin_client, declared: list[str]
) -> None:
    admin_schedule("mine", payload={"n": 1}, tenant="acme", enabled=False)  # off, yet run
    declared.extend(["coded", "gone"])
    pgqueue.periodic("0 * * * *", task=TASK, name="coded", tenant="acme")
    pgqueue.periodic("0 * * * *", task=TASK, name="gone")
    sync_schedules()
    schedules.undeclare("gone")
    sync_schedules()
    before = {n: row(n) for n in ("mine", "coded", "gone")}
    response = act(admin_client, "run_now", ["mine", "coded", "gone"])
    texts = message_texts(response)
    mine, coded = (
        Job.objects.get(idempotency_key__startswith=f"periodic:{n}:now:") for n in ("mine", "coded")
    )
    assert f'<a href="/admin/pgqueue/job/{coded.id}/change/">job {coded.id}</a> (coded)' in "".join(
        texts
    )
    assert any(t.startswith("Enqueued 2 job(s): ") for t in texts), texts
    assert any(t.startswith("gone: not run:") and "removed from code" in t for t in texts), texts
    assert (mine.payload, mine.tenant_id, coded.tenant_id) == ({"n": 1}, "acme", "acme")
    assert not jobs_of("gone")
    for name, was in before.items():
        now = row(name)
        assert (now.next_run_at, now.last_run_at, now.last_job_id, now.enabled) == (
            was.next_run_at, was.last_run_at, was.last_job_id, was.enabled
        )  # fmt: skip


@pytest.mark.django_db
def test_a_schedule_of_the_code_is_read_only_in_the_admin(
    admin_client, declared: list[str]
) -> None:
    declared.append("coded")
    pgqueue.periodic(every=FIVE, task=TASK, name="coded", payload={"a": 1})
    sync_schedules()
    response = admin_client.get(change_url("coded"))
    page = response.content.decode()
    assert response.status_code == 200
    assert "Declared in code" in page and "every 5m" in page
    assert 'name="every"' not in page and 'name="_save"' not in page
    assert admin_client.post(change_url("coded"), form(name="coded")).status_code == 403
    assert admin_client.get(f"{ADMIN}{row('coded').pk}/delete/").status_code == 403
    assert row("coded").every == FIVE
    # Gone from the code, it may be deleted (its jobs stay).
    schedules.undeclare("coded")
    sync_schedules()
    response = admin_client.post(f"{ADMIN}{row('coded').pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not PeriodicSchedule.objects.filter(name="coded").exists()


@pytest.mark.django_db
def test_the_admin_deletes_its_own_schedule_and_leaves_its_jobs(admin_client) -> None:
    admin_schedule("mine")
    job_id = run_schedule_now("mine")
    assert "delete_selected" not in admin_client.get(ADMIN).content.decode()
    response = admin_client.post(f"{ADMIN}{row('mine').pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not PeriodicSchedule.objects.filter(name="mine").exists()
    assert Job.objects.filter(id=job_id).exists()


# -- the CLI ------------------------------------------------------------------------------


def pgq(*args: str) -> str:
    out = io.StringIO()
    call_command("pgqueue", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_the_cli_lists_interval_schedules(declared: list[str]) -> None:
    declared.append("coded")
    pgqueue.periodic("*/5 * * * *", task=TASK, name="coded")
    sync_schedules(now=at("2026-01-01T10:01Z"))
    admin_schedule("mine", every=dt.timedelta(hours=1, minutes=30), now=at("2026-01-01T10:01Z"))
    document = json.loads(pgq("periodic", "--json"))
    by_name = {r["name"]: r for r in document["results"]}
    assert (by_name["mine"]["cron"], by_name["mine"]["every_seconds"]) == (None, 5400)
    assert (by_name["coded"]["cron"], by_name["coded"]["every_seconds"]) == ("*/5 * * * *", None)
    assert (by_name["mine"]["source"], by_name["coded"]["source"]) == ("admin", "code")
    lines = pgq("periodic").splitlines()
    assert re.split(r"\s{2,}", lines[0])[:3] == ["NAME", "SCHEDULE", "TIME ZONE"]
    cells = {c[0]: c for c in (re.split(r"\s{2,}", line.strip()) for line in lines[1:])}
    assert cells["mine"][:3] == ["mine", "every 1h 30m", "-"] and cells["mine"][-1] == "admin"
    assert cells["coded"][:3] == ["coded", "*/5 * * * *", "UTC"] and cells["coded"][-1] == "code"
