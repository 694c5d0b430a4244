"""App wiring: migrations, settings, system checks and task discovery."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings

import pgqueue
from pgqueue import checks
from pgqueue.conf import DEFAULTS, pgqueue_settings
from pgqueue.registry import registered_tasks


@pytest.mark.django_db(databases=["default", "queue"])  # it looks at every alias's history
def test_models_and_migrations_agree():
    """`makemigrations --check` stays clean: the schema in the migrations is the models'."""
    out = io.StringIO()
    call_command("makemigrations", "pgqueue", "--check", "--dry-run", stdout=out)


@pytest.mark.django_db
def test_partial_indexes_hold_only_what_their_query_matches():
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'pgqueue_job'")
        defs = dict(cur.fetchall())
    assert "WHERE ((NOT gated) AND ((status)::text = 'queued'::text))" in defs["pgqueue_job_claim"]
    assert "WHERE (gated AND ((status)::text = 'queued'::text))" in defs["pgqueue_job_gated"]
    assert "(queue, priority DESC, vtime, id)" in defs["pgqueue_job_claim"]
    assert "'scheduled'" in defs["pgqueue_job_scheduled"]
    assert "'running'" in defs["pgqueue_job_lease"]
    assert "IS NOT NULL" in defs["pgqueue_job_idempotency"]


def test_tasks_modules_of_installed_apps_are_discovered():
    assert {"test.noop", "test.echo", "test.limited"} <= set(registered_tasks())


def test_registering_a_different_function_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):

        @pgqueue.task(name="test.noop")
        def impostor(payload, job):
            return None


def test_settings_have_defaults_and_follow_override_settings():
    assert pgqueue_settings.LEASE_SECONDS == DEFAULTS["LEASE_SECONDS"]
    assert pgqueue_settings.heartbeat_seconds == DEFAULTS["LEASE_SECONDS"] / 3
    with override_settings(PGQUEUE={"LEASE_SECONDS": 12}):
        assert pgqueue_settings.LEASE_SECONDS == 12
        assert pgqueue_settings.heartbeat_seconds == 4
    assert pgqueue_settings.LEASE_SECONDS == DEFAULTS["LEASE_SECONDS"]


def test_default_settings_pass_the_checks():
    assert checks.check_settings() == []


@pytest.mark.parametrize("rate", [None, "100/s", "20/min", "1000/h", "5/day"])
def test_rates_in_drfs_form_pass_the_checks(rate):
    with override_settings(PGQUEUE={"API_RATE_LIMIT": rate, "AUTH_FAILURE_RATE": rate}):
        assert checks.check_settings() == []


@pytest.mark.parametrize(
    ("pgqueue", "fragment"),
    [
        ({"LEASE_SECONDS": 0}, "LEASE_SECONDS"),
        ({"LEASE_SECONDS": "30"}, "LEASE_SECONDS"),
        ({"BATCH_SIZE": 2.5}, "BATCH_SIZE"),
        ({"DEFAULT_MAX_ATTEMPTS": 0}, "DEFAULT_MAX_ATTEMPTS"),
        ({"DEFAULT_MAX_ATTEMPTS": 101}, "DEFAULT_MAX_ATTEMPTS"),
        ({"ORDERING": "lifo"}, "ORDERING"),
        ({"HEARTBEAT_SECONDS": 40, "LEASE_SECONDS": 30}, "HEARTBEAT_SECONDS"),
        ({"DEFAULT_TENANT": ""}, "DEFAULT_TENANT"),
        ({"LEASE_SECOND": 3}, "Unknown PGQUEUE setting(s): LEASE_SECOND"),
        ({"API_RATE_LIMIT": "100 per second"}, "API_RATE_LIMIT"),
        ({"API_RATE_LIMIT": 100}, "API_RATE_LIMIT"),
        ({"AUTH_FAILURE_RATE": "0/min"}, "AUTH_FAILURE_RATE"),
        ({"AUTH_FAILURE_RATE": "20/fortnight"}, "AUTH_FAILURE_RATE"),
    ],
)
def test_invalid_settings_are_reported_by_name(pgqueue, fragment):
    with override_settings(PGQUEUE=pgqueue):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["pgqueue.E003"]
    assert fragment in errors[0].msg


@pytest.mark.django_db
def test_database_check_accepts_this_postgresql():
    assert checks.check_database(databases=["default"]) == []


# Another vendor (pgqueue.E001) is reported without a database: tests/test_checks.py.


@pytest.mark.django_db
def test_database_check_refuses_postgresql_older_than_14(monkeypatch):
    # The server here is new enough; what the check does with an old one is decided by
    # the version the connection reports, so that is the one thing replaced.
    monkeypatch.setitem(connections["default"].__dict__, "pg_version", 130011)
    errors = checks.check_database(databases=["default"])
    assert [e.id for e in errors] == ["pgqueue.E002"]
    assert "13.11" in errors[0].msg and "14" in errors[0].msg
