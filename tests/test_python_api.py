"""The Python API: what enqueue accepts, what it refuses, and what it costs."""

from __future__ import annotations

import datetime as dt
import decimal
import inspect

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from django.utils.connection import ConnectionDoesNotExist

import pgqueue
from pgqueue import services, store
from pgqueue.models import FairClock, Job, Status, Tenant
from tests.conftest import claim, drain


@pytest.mark.django_db
class TestEnqueue:
    def test_returns_the_job_and_created(self):
        job, created = pgqueue.enqueue("test.echo", {"text": "hi"}, tenant="acme", priority=5)
        assert created is True
        stored = Job.objects.get(pk=job.pk)
        assert (stored.task, stored.tenant_id, stored.queue) == ("test.echo", "acme", "default")
        assert (stored.status, stored.priority, stored.payload) == ("queued", 5, {"text": "hi"})
        assert stored.vtime is not None and stored.max_attempts == 5
        assert job.status == stored.status

    def test_a_new_tenant_is_created_with_weight_one(self):
        pgqueue.enqueue("test.noop", tenant="brand-new")
        assert Tenant.objects.get(pk="brand-new").weight == 1.0

    def test_defaults_come_from_settings_then_task_then_call(self):
        with override_settings(
            PGQUEUE={"DEFAULT_TENANT": "t0", "DEFAULT_QUEUE": "q0", "DEFAULT_MAX_ATTEMPTS": 9}
        ):
            plain, _ = pgqueue.enqueue("test.noop")
            from_task, _ = pgqueue.enqueue("test.limited")
            overridden, _ = pgqueue.enqueue(
                "test.limited", queue="other", priority=-3, max_attempts=4
            )
        assert (plain.tenant_id, plain.queue, plain.max_attempts) == ("t0", "q0", 9)
        assert (from_task.queue, from_task.priority, from_task.max_attempts) == ("limited", 7, 2)
        assert (overridden.queue, overridden.priority, overridden.max_attempts) == (
            "other",
            -3,
            4,
        )

    def test_task_object_and_its_enqueue_method(self):
        from tests.taskapp.tasks import echo

        job, _ = pgqueue.enqueue(echo, [1, 2])
        job2, _ = echo.enqueue({"x": 1}, tenant="acme")
        assert Job.objects.get(pk=job.pk).payload == [1, 2]
        assert Job.objects.get(pk=job2.pk).tenant_id == "acme"

    def test_delay_and_future_run_at_are_scheduled_past_run_at_is_now(self):
        delayed, _ = pgqueue.enqueue("test.noop", delay=60)
        future, _ = pgqueue.enqueue("test.noop", run_at=timezone.now() + dt.timedelta(hours=1))
        past, _ = pgqueue.enqueue("test.noop", run_at=timezone.now() - dt.timedelta(hours=1))
        zero, _ = pgqueue.enqueue("test.noop", delay=dt.timedelta(0))
        statuses = dict(Job.objects.values_list("id", "status"))
        assert statuses[delayed.pk] == statuses[future.pk] == Status.SCHEDULED
        assert statuses[past.pk] == statuses[zero.pk] == Status.QUEUED
        assert Job.objects.get(pk=delayed.pk).vtime is None
        assert [j.id for j in drain()] == [past.pk, zero.pk]

    def test_idempotency_key_returns_the_original_job(self):
        first, created = pgqueue.enqueue("test.noop", {"n": 1}, tenant="acme", idempotency_key="k")
        again, created_again = pgqueue.enqueue(
            "test.noop", {"n": 2}, tenant="acme", idempotency_key="k"
        )
        other_tenant, created_other = pgqueue.enqueue(
            "test.noop", tenant="other", idempotency_key="k"
        )
        assert created and not created_again and created_other
        assert again.pk == first.pk and again.payload == {"n": 1}
        assert other_tenant.pk != first.pk
        # The duplicate charged no virtual time: the clock is at the one job's vtime.
        clock = FairClock.objects.get(tenant_id="acme", queue="default", priority=0)
        assert clock.vtime == Job.objects.get(pk=first.pk).vtime

    @pytest.mark.parametrize(
        "options",
        [{}, {"delay": 60}, {"idempotency_key": "k", "priority": 3}],
        ids=["queued", "scheduled", "with-key"],
    )
    def test_the_returned_job_is_the_stored_row(self, options):
        """What enqueue returns is the job as stored, field for field, without a read.

        run_at and created_at are the database's values, real datetimes (never Django's
        DatabaseDefault placeholders), and so are the id and vtime. A duplicate key
        returns the stored original too.
        """
        job, created = pgqueue.enqueue("test.echo", {"text": "hi"}, tenant="acme", **options)
        assert created
        assert isinstance(job.run_at, dt.datetime) and isinstance(job.created_at, dt.datetime)
        assert not job._state.adding
        stored = Job.objects.get(pk=job.pk)
        for field in Job._meta.concrete_fields:
            assert getattr(job, field.attname) == getattr(stored, field.attname), field.name
        if "idempotency_key" in options:
            again, created_again = pgqueue.enqueue(
                "test.echo", {"text": "other"}, tenant="acme", **options
            )
            assert not created_again
            for field in Job._meta.concrete_fields:
                assert getattr(again, field.attname) == getattr(stored, field.attname)

    def test_enqueue_many_keeps_order_and_spans_chunks(self):
        ids = pgqueue.enqueue_many("test.echo", [{"i": i} for i in range(2500)], tenant="acme")
        assert len(ids) == 2500 and ids == sorted(ids)
        order = drain(batch=100)
        assert [j.payload["i"] for j in order] == list(range(2500))
        assert pgqueue.enqueue_many("test.echo", []) == []

    def test_enqueue_many_scheduled(self):
        ids = pgqueue.enqueue_many("test.noop", [1, 2], delay=30, tenant="acme")
        assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"scheduled"}


@pytest.mark.django_db
class TestRefused:
    """Bad input is refused before anything is written, naming the field and the reason."""

    @pytest.mark.parametrize(
        ("kwargs", "field", "reason"),
        [
            ({"tenant": ""}, "tenant", "must not be empty"),
            ({"tenant": "has space"}, "tenant", "must match"),
            ({"tenant": "x" * 65}, "tenant", "must match"),
            ({"queue": "a/b"}, "queue", "must match"),
            # `$` would match before a trailing newline: names are matched whole (\Z)
            ({"queue": "default\n"}, "queue", "must match"),
            ({"tenant": "acme\n"}, "tenant", "must match"),
            ({"priority": 101}, "priority", "from -100 to 100"),
            ({"priority": -101}, "priority", "from -100 to 100"),
            ({"priority": True}, "priority", "integer"),
            ({"priority": 1.5}, "priority", "integer"),
            ({"max_attempts": 0}, "max_attempts", "from 1 to 100"),
            ({"max_attempts": 101}, "max_attempts", "from 1 to 100"),
            ({"delay": -1}, "delay", "from 0 to"),
            ({"delay": "soon"}, "delay", "number of seconds"),
            ({"delay": 1, "run_at": timezone.now()}, "run_at", "not both"),
            ({"run_at": dt.datetime(2030, 1, 1)}, "run_at", "timezone-aware"),
            ({"run_at": "tomorrow"}, "run_at", "datetime"),
            ({"idempotency_key": ""}, "idempotency_key", "1 to 255"),
            ({"idempotency_key": "k" * 256}, "idempotency_key", "1 to 255"),
        ],
    )
    def test_invalid_options(self, kwargs, field, reason):
        with pytest.raises(pgqueue.InvalidJob) as exc:
            pgqueue.enqueue("test.noop", {}, **kwargs)
        assert exc.value.field == field
        assert reason in exc.value.reason
        assert not Job.objects.exists()

    def test_a_rate_with_a_trailing_newline_is_refused(self):
        from pgqueue.limits import parse_rate

        assert parse_rate("5/s") == (5, 1)
        with pytest.raises(pgqueue.InvalidJob) as exc:
            parse_rate("5/s\n")
        assert exc.value.field == "rate_limit"

    def test_unknown_task_names_the_task(self):
        with pytest.raises(pgqueue.UnknownTask, match=r"'no\.such\.task'") as exc:
            pgqueue.enqueue("no.such.task", {})
        assert exc.value.field == "task"
        assert not Job.objects.exists()

    @pytest.mark.parametrize(
        "payload", [{1, 2}, object(), {"n": float("nan")}, decimal.Decimal(1), b"bytes"]
    )
    def test_payload_that_is_not_json(self, payload):
        with pytest.raises(pgqueue.InvalidJob, match="JSON") as exc:
            pgqueue.enqueue("test.noop", payload)
        assert exc.value.field == "payload"

    def test_payload_too_large(self):
        with (
            override_settings(PGQUEUE={"MAX_PAYLOAD_BYTES": 100}),
            pytest.raises(pgqueue.PayloadTooLarge),
        ):
            pgqueue.enqueue("test.noop", {"text": "x" * 200})

    def test_one_bad_payload_refuses_the_whole_batch(self):
        with pytest.raises(pgqueue.InvalidJob) as exc:
            pgqueue.enqueue_many("test.noop", [{"ok": 1}, {"bad": {1}}, {"ok": 2}])
        assert exc.value.field == "payloads[1]"
        assert not Job.objects.exists()

    def test_weight_must_be_positive(self):
        for bad in (0, -1, float("inf"), "3", True):
            with pytest.raises(pgqueue.InvalidJob) as exc:
                services.set_tenant_weight("acme", bad)
            assert exc.value.field == "weight"


@pytest.mark.django_db
def test_enqueue_inside_the_callers_transaction():
    """The job commits or rolls back with the caller's own writes."""
    with transaction.atomic():
        job, _ = pgqueue.enqueue("test.noop", tenant="acme")
        assert Job.objects.filter(pk=job.pk).exists()  # visible inside the transaction
        transaction.set_rollback(True)
    assert not Job.objects.filter(pk=job.pk).exists()


@pytest.mark.django_db
class TestQueryBudgets:
    """The hot paths cost a fixed number of statements, whatever the batch size."""

    def test_enqueue_is_one_statement(self, django_assert_num_queries):
        pgqueue.enqueue("test.noop", tenant="acme")  # the tenant and clock exist from now on
        with django_assert_num_queries(1):
            pgqueue.enqueue("test.noop", {"a": 1}, tenant="acme")
        with django_assert_num_queries(1):
            pgqueue.enqueue("test.noop", tenant="acme", delay=10)
        with django_assert_num_queries(1):  # scheduled: a queue of the tenant's is enough
            pgqueue.enqueue("test.noop", tenant="acme", priority=3, delay=10)

    def test_a_tenants_first_job_at_a_level_is_two_statements(self, django_assert_num_queries):
        """Without a clock of the tenant there, JOB_ENQUEUE finds none and writes nothing;
        JOB_ENQUEUE_FIRST counts the tenant's queues (a queue new to it only) and creates
        the clock. The next job there is one statement again."""
        pgqueue.enqueue("test.noop", tenant="acme")
        with django_assert_num_queries(2):
            pgqueue.enqueue("test.noop", {"a": 1}, tenant="acme", priority=3)
        with django_assert_num_queries(1):
            pgqueue.enqueue("test.noop", {"a": 1}, tenant="acme", priority=3)
        with django_assert_num_queries(2):
            pgqueue.enqueue("test.noop", tenant="newcomer", delay=10)
        with django_assert_num_queries(1):
            pgqueue.enqueue("test.noop", tenant="newcomer", delay=10)

    def test_enqueue_with_a_key_adds_only_a_savepoint(self, django_assert_num_queries):
        pgqueue.enqueue("test.noop", tenant="acme")  # its clock (see the test above)
        with django_assert_num_queries(3):  # SAVEPOINT, JOB_ENQUEUE, RELEASE
            pgqueue.enqueue("test.noop", tenant="acme", idempotency_key="once")

    def test_a_duplicate_key_costs_one_read(self, django_assert_num_queries):
        first, _ = pgqueue.enqueue("test.noop", tenant="acme", idempotency_key="once")
        with django_assert_num_queries(4) as captured:  # SAVEPOINT, JOB_ENQUEUE, RELEASE, read
            again, created = pgqueue.enqueue("test.noop", tenant="acme", idempotency_key="once")
        assert (again.pk, created) == (first.pk, False)
        assert captured.captured_queries[-1]["sql"].startswith("SELECT")

    def test_enqueue_many_is_one_statement_per_thousand(self, django_assert_num_queries):
        pgqueue.enqueue("test.noop", tenant="acme")  # its clock
        with django_assert_num_queries(3):  # SAVEPOINT, JOB_ENQUEUE, RELEASE
            pgqueue.enqueue_many("test.noop", list(range(1000)), tenant="acme")
        with django_assert_num_queries(4):
            pgqueue.enqueue_many("test.noop", list(range(1001)), tenant="acme")

    def test_claim_and_complete_are_one_statement_each(self, django_assert_num_queries):
        pgqueue.enqueue_many("test.noop", list(range(20)), tenant="acme")
        with django_assert_num_queries(1):
            jobs = claim("w1", limit=20)
        assert len(jobs) == 20
        with django_assert_num_queries(1), connection.cursor() as cur:
            done = store.complete_many(
                cur, worker="w1", results=[(j.id, j.attempt, "null") for j in jobs]
            )
        assert len(done) == 20


# -- the signatures help() and IDEs show ---------------------------------------------------

ENQUEUE_OPTIONS = [
    "tenant",
    "queue",
    "priority",
    "delay",
    "run_at",
    "idempotency_key",
    "max_attempts",
    "timeout",
    "concurrency_key",
    "key_max_running",
    "depends_on",
    "on_upstream_failure",
    "using",
]


def keyword_only(func: object) -> list[str]:
    return [
        name
        for name, p in inspect.signature(func).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


class TestSignatures:
    """``pgqueue.enqueue`` and ``Task.enqueue`` spell their options out, so ``help()`` and
    editors show them; the services' options are the reference, so a new one is not
    forgotten here."""

    @pytest.mark.parametrize(
        ("public", "reference"),
        [
            (pgqueue.enqueue, services.enqueue),
            (pgqueue.Task.enqueue, services.enqueue),
            (pgqueue.enqueue_many, services.enqueue_many),
            (pgqueue.Task.enqueue_many, services.enqueue_many),
        ],
    )
    def test_the_options_are_spelled_out_with_types(self, public, reference):
        params = inspect.signature(public).parameters
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        assert sorted(keyword_only(public)) == sorted(keyword_only(reference))
        for name in keyword_only(public):
            assert params[name].annotation is not inspect.Parameter.empty, name
        assert public.__doc__

    def test_enqueue_lists_every_option(self):
        assert keyword_only(pgqueue.enqueue) == ENQUEUE_OPTIONS
        assert keyword_only(pgqueue.enqueue_many) == [
            o for o in ENQUEUE_OPTIONS if o != "idempotency_key"
        ]
        assert "idempotency_key" in (pgqueue.enqueue.__doc__ or "")

    @pytest.mark.django_db
    @pytest.mark.parametrize("via", ["module", "task"])
    def test_each_option_is_forwarded(self, via):
        from tests.taskapp.tasks import echo

        enqueue = (
            pgqueue.enqueue if via == "module" else (lambda _t, *a, **k: echo.enqueue(*a, **k))
        )
        enqueue_many = (
            pgqueue.enqueue_many
            if via == "module"
            else (lambda _t, *a, **k: echo.enqueue_many(*a, **k))
        )
        when = timezone.now() + dt.timedelta(hours=2)
        job, _ = enqueue(
            "test.echo",
            {"n": 1},
            tenant="fwd",
            queue="fwd-q",
            priority=7,
            run_at=when,
            idempotency_key=f"fwd-{via}",
            max_attempts=3,
            concurrency_key=f"fwd:{via}",
            key_max_running=2,
            using="default",
        )
        stored = Job.objects.get(pk=job.pk)
        assert (stored.tenant_id, stored.queue, stored.priority) == ("fwd", "fwd-q", 7)
        assert (stored.idempotency_key, stored.max_attempts) == (f"fwd-{via}", 3)
        assert (stored.concurrency_key, stored.key_max_running) == (f"fwd:{via}", 2)
        assert (stored.key_state, stored.gated) == ("new", None)
        assert (stored.status, stored.run_at) == ("scheduled", when)
        delayed, _ = enqueue("test.echo", {}, delay=3600)
        assert Job.objects.get(pk=delayed.pk).run_at > timezone.now() + dt.timedelta(minutes=59)
        ids = enqueue_many(
            "test.echo",
            [{}, {}],
            tenant="fwd",
            queue="fwd-q",
            priority=-3,
            delay=60,
            max_attempts=2,
            concurrency_key=lambda payload: None,
            key_max_running=3,
            using="default",
        )
        rows = Job.objects.filter(pk__in=ids)
        assert {(j.tenant_id, j.queue, j.priority, j.max_attempts, j.status) for j in rows} == {
            ("fwd", "fwd-q", -3, 2, "scheduled")
        }
        assert {(j.concurrency_key, j.key_state) for j in rows} == {(None, "")}
        when_many = timezone.now() + dt.timedelta(hours=3)
        (later_id,) = enqueue_many("test.echo", [{}], run_at=when_many)
        assert Job.objects.get(pk=later_id).run_at == when_many
        # ``using`` reaches the services: an unknown alias is refused by Django.
        with pytest.raises(ConnectionDoesNotExist):
            enqueue("test.echo", {}, using="no-such-database")
        with pytest.raises(ConnectionDoesNotExist):
            enqueue_many("test.echo", [{}], using="no-such-database")
