"""PGQUEUE["DATABASE"]: the queue's tables in a database alias of their own.

tests/settings.py defines a second alias, "queue" (its own database on the same server),
and installs pgqueue.router.QueueRouter; the rest of the suite keeps PGQUEUE["DATABASE"]
at "default", where the router has no opinion. Here it is "queue": every entry point
(Python, HTTP, the Tasks backend, a real runworker, the admin) must read and write there
and leave the default database alone. The migration test runs ``migrate`` in a subprocess
on two fresh databases, since pytest-django migrated the test ones with the setting off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.checks import Error
from django.db import connections
from django.test import override_settings

import pgqueue
from pgqueue.checks import check_queue_database
from pgqueue.models import Job
from tests import api_fixtures
from tests.workers import REPO, STARTUP, StartWorker, database_url

BOTH = ["default", "queue"]
ON_QUEUE = {"DATABASE": "queue"}


@pytest.fixture
def on_queue() -> Iterator[None]:
    with override_settings(PGQUEUE=ON_QUEUE):
        yield


def where(job_id: int) -> set[str]:
    """The aliases whose pgqueue_job holds ``job_id``."""
    return {alias for alias in BOTH if Job.objects.using(alias).filter(pk=job_id).exists()}


@pytest.mark.django_db(databases=BOTH)
def test_python_http_and_tasks_backend_enqueue_on_the_queue_database(on_queue: None) -> None:
    job, _ = pgqueue.enqueue("test.echo", {"n": 1}, tenant="acme")
    assert where(job.id) == {"queue"}
    assert job._state.db == "queue"

    response = api_fixtures.client(api_fixtures.new_key()).post(
        "/jobs", {"task": "test.echo", "payload": {"n": 2}, "tenant": "acme"}, format="json"
    )
    assert response.status_code == 201, response.content
    assert where(response.json()["id"]) == {"queue"}

    from tests.taskapp import django_tasks

    tasks = {"default": {"BACKEND": "pgqueue.backends.PgQueueBackend"}}
    with override_settings(TASKS=tasks):
        result = django_tasks.add.enqueue(2, 3)
        assert where(int(result.id)) == {"queue"}
        assert django_tasks.add.get_result(result.id).id == result.id


@pytest.mark.django_db(databases=BOTH)
def test_the_admin_lists_the_queue_databases_jobs(on_queue: None, admin_client: Any) -> None:
    job, _ = pgqueue.enqueue("test.echo", {"n": 1}, tenant="only-on-queue")
    response = admin_client.get("/admin/pgqueue/job/")
    assert response.status_code == 200
    assert b"only-on-queue" in response.content
    response = admin_client.get(f"/admin/pgqueue/job/{job.id}/change/")
    assert response.status_code == 200


@pytest.mark.django_db(databases=BOTH, transaction=True)
def test_a_worker_runs_the_jobs_of_the_queue_database(on_queue: None, workers: StartWorker) -> None:
    ids = pgqueue.enqueue_many("test.echo", [{"n": n} for n in range(5)], tenant="acme")
    w = workers(
        "--burst",
        settings=ON_QUEUE,
        extra_env={"QUEUE_DATABASE_URL": database_url("queue")},
    )
    assert w.wait_exit(STARTUP) == 0, w.log()
    done = Job.objects.using("queue").filter(pk__in=ids, status="done").count()
    assert done == len(ids), w.log()
    assert not Job.objects.using("default").exists()


def test_the_check_names_a_missing_alias_and_a_missing_router() -> None:
    with override_settings(PGQUEUE={"DATABASE": "nope"}):
        assert [e.id for e in check_queue_database()] == ["pgqueue.E030"]
    with override_settings(PGQUEUE=ON_QUEUE, DATABASE_ROUTERS=[]):
        (error,) = check_queue_database()
        assert isinstance(error, Error) and error.id == "pgqueue.E031"
        assert "QueueRouter" in error.hint
    with override_settings(PGQUEUE=ON_QUEUE):
        assert check_queue_database() == []
    assert check_queue_database() == []  # "default", routed by the router's silence


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    return {name for (name,) in rows}


@pytest.fixture
def fresh_databases() -> Iterator[tuple[str, str]]:
    """Two empty databases on the test server: (app's URL, queue's URL); dropped after."""
    base = connections["default"].settings_dict["NAME"]
    names = [f"{base}_mig", f"{base}_mig_q"]
    admin = database_url().rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
    urls = [database_url().rsplit("/", 1)[0] + f"/{name}" for name in names]
    try:
        yield urls[0], urls[1]
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_puts_pgqueue_on_the_queue_alias_and_nothing_else_there(
    fresh_databases: tuple[str, str],
) -> None:
    app_url, queue_url = fresh_databases
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.worker_settings",
        DATABASE_URL=app_url,
        QUEUE_DATABASE_URL=queue_url,
        PGQUEUE_DATABASE='"queue"',
    )
    for alias in BOTH:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--database", alias, "-v", "0"],
            cwd=REPO,
            env=env,
            check=True,
            timeout=300,
        )
    on_app, on_queue = _tables(app_url), _tables(queue_url)
    assert not {t for t in on_app if t.startswith("pgqueue_")}
    assert {"auth_user", "django_content_type", "django_session"} <= on_app
    assert {"pgqueue_job", "pgqueue_job_attempt", "pgqueue_tenant"} <= on_queue
    # Besides pgqueue's, only the table in which Django records what it migrated.
    assert {t for t in on_queue if not t.startswith("pgqueue_")} == {"django_migrations"}
