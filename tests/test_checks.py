"""pgqueue on a database it cannot use, and ``manage.py pgqueue worker``.

A new project starts on SQLite. pgqueue must say so at plain ``manage.py check`` (and so at
``runserver``), not only at ``migrate``, and ``runworker`` must refuse in one line instead
of failing inside psycopg-specific code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core import checks as django_checks
from django.test import override_settings

import pgqueue
from pgqueue import checks
from pgqueue.models import Job
from tests.workers import database_url

REPO = Path(__file__).resolve().parent.parent
SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
REFUSAL = "pgqueue needs PostgreSQL 14 or newer, but DATABASES['default'] uses sqlite"

# Django warns that overriding DATABASES does not re-create connections: these tests only
# read the settings, which is what the check does.
sqlite_default = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def manage(*args: str, settings_module: str, timeout: float = 60, **env: str):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    environ.update(DJANGO_SETTINGS_MODULE=settings_module, PYTHONUNBUFFERED="1", **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- the check ------------------------------------------------------------------------------


def test_the_engine_check_accepts_postgresql():
    assert checks.check_database_engine() == []


@sqlite_default
def test_the_engine_check_refuses_sqlite_without_connecting():
    with override_settings(DATABASES={**settings.DATABASES, "default": SQLITE}):
        errors = checks.check_database_engine()
    assert [e.id for e in errors] == ["pgqueue.E001"]
    assert REFUSAL in errors[0].msg
    assert "django.db.backends.sqlite3" in errors[0].msg


@sqlite_default
def test_the_engine_check_runs_with_the_checks_that_need_no_database():
    """What plain ``manage.py check`` and ``runserver`` run: no database tags, no aliases."""
    with override_settings(DATABASES={**settings.DATABASES, "default": SQLITE}):
        errors = django_checks.run_checks(databases=None)
    assert "pgqueue.E001" in [e.id for e in errors]


@sqlite_default
def test_the_engine_check_looks_only_at_the_alias_pgqueue_uses():
    with override_settings(DATABASES={**settings.DATABASES, "legacy": SQLITE}):
        assert checks.check_database_engine() == []


@sqlite_default
def test_a_backend_derived_from_postgresqls_is_postgresql():
    # As instrumented backends (django-prometheus's, for one) do: tests/derived_backend.
    derived = {**settings.DATABASES["default"], "ENGINE": "tests.derived_backend"}
    with override_settings(DATABASES={**settings.DATABASES, "default": derived}):
        assert checks.check_database_engine() == []


def test_the_version_check_leaves_other_vendors_to_the_engine_check(monkeypatch):
    from django.db.utils import ConnectionHandler

    other = ConnectionHandler({"default": SQLITE})
    monkeypatch.setattr(checks, "connections", other)
    assert checks.check_database(databases=["default"]) == []


def test_manage_py_check_says_the_api_needs_its_apps():
    """With DRF installed but not in INSTALLED_APPS, the browsable API would answer 500
    (its templates are the app's): ``check``, which imports the URLconf, says so first."""
    result = manage("check", settings_module="tests.settings_no_drf_apps")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ImproperlyConfigured" in result.stderr
    assert "needs rest_framework and drf_spectacular in INSTALLED_APPS" in result.stderr


def test_manage_py_check_reports_sqlite():
    result = manage("check", settings_module="tests.sqlite_settings")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pgqueue.E001" in result.stderr
    assert REFUSAL in result.stderr


def test_runserver_reports_sqlite_at_start_up():
    result = manage(
        "runserver", "--noreload", "127.0.0.1:0", settings_module="tests.sqlite_settings"
    )
    assert result.returncode != 0, result.stdout + result.stderr
    assert "pgqueue.E001" in result.stderr


# -- runworker on SQLite --------------------------------------------------------------------


@pytest.mark.parametrize("command", [["runworker"], ["pgqueue", "worker"]])
def test_the_worker_refuses_sqlite(command):
    result = manage(*command, "--burst", settings_module="tests.sqlite_settings")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert REFUSAL in result.stderr
    assert "invalid connection option" not in output
    assert "Traceback" not in output


@pytest.mark.parametrize("command", [["runworker"], ["pgqueue", "worker"]])
def test_the_worker_refuses_sqlite_in_one_line_without_the_system_checks(command):
    result = manage(*command, "--burst", "--skip-checks", settings_module="tests.sqlite_settings")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"CommandError: {REFUSAL} (django.db.backends.sqlite3)."
    ]


# -- manage.py pgqueue worker ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_pgqueue_worker_exits_0_on_an_empty_queue():
    # Django's own options after the subcommand, as after runworker.
    result = manage(
        "pgqueue", "worker", "--burst", "-v", "0",
        settings_module="tests.worker_settings", DATABASE_URL=database_url(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""


@pytest.mark.django_db(transaction=True)
def test_pgqueue_worker_is_runworker():
    job, _ = pgqueue.enqueue("test.echo", {"n": 7}, tenant="acme")
    result = manage(
        "pgqueue", "worker", "--burst", "--concurrency", "2", "--queues", "default",
        settings_module="tests.worker_settings", DATABASE_URL=database_url(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    job = Job.objects.get(pk=job.pk)
    assert (job.status, job.result) == ("done", {"n": 7})
    line = "event=recorded jobs=1 done=1 failed=0 dead=0 cancelled=0 discarded=0 snoozed=0"
    assert f"{line} ids={job.pk}" in result.stderr
