"""``manage.py runworker`` as a real subprocess, for the tests that need a running worker.

Each worker runs as ``python manage.py runworker ...`` with DJANGO_SETTINGS_MODULE
``tests.worker_settings`` and DATABASE_URL pointing at the test database pytest-django
created, so a test using them must be transactional: the worker only sees committed rows.
Timings (lease, backoff, maintenance, polling) go to the worker as ``PGQUEUE_<NAME>``
variables. Each worker's output goes to a file under the test's ``tmp_path`` and is printed
at teardown, so a failing test shows it; teardown SIGKILLs whatever is still running (the
whole process group, children included).

tests/conftest.py makes the ``workers`` fixture available to every test module.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import psycopg
import pytest
from django.db import connection, connections

from pgqueue.models import JobAttempt
from pgqueue.models import Worker as WorkerRow

REPO = Path(__file__).resolve().parent.parent
POLL = 0.05  # seconds between two looks at the database while waiting
STARTUP = 20.0  # bound on a worker process starting and registering
#: Timings for tests of lease recovery: short lease, quick maintenance, tiny backoff.
FAST_RECOVERY = {"LEASE_SECONDS": 2, "MAINTENANCE_SECONDS": 0.2, "BACKOFF_BASE": 0.05}

T = TypeVar("T")


# -- waiting --------------------------------------------------------------------------------


def wait_for(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``predicate`` every 50 ms until it returns something truthy, and return that.

    Fails the test with ``what`` when ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.1f}s waiting for {what}", pytrace=False)
        time.sleep(POLL)


def waiting_on_a_lock(pid: int) -> bool:
    """The backend ``pid`` is waiting for a lock now (pg_stat_activity), read on Django's
    connection: how a test knows another connection's statement is blocked where it meant."""
    with connection.cursor() as cur:
        cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cur.fetchone()
    return row is not None and row[0] == "Lock"


# -- the worker subprocess ------------------------------------------------------------------


@contextlib.contextmanager
def scratch_database(name: str) -> Iterator[dict[str, Any]]:
    """An empty database ``name`` of its own on the test server, dropped afterwards (a
    fresh project's, as a new user's would be). Yields the default alias's settings."""
    from psycopg import sql

    s = connections["default"].settings_dict
    server: dict[str, Any] = {
        "host": s["HOST"] or None,
        "port": s["PORT"] or None,
        "user": s["USER"] or None,
        "password": s["PASSWORD"] or None,
        **(s.get("OPTIONS") or {}),
    }
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield s
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
            conn.execute(drop)


def clone_files(destination: Path) -> None:
    """Copy the files a clone of this checkout has to ``destination``: tracked, or new and
    not ignored (an *.egg-info left here by an editable install lists files that a clone's
    build would leave out)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():  # not a file deleted but not yet committed
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)


def database_url(alias: str = "default") -> str:
    """A DATABASE_URL (as demo_project/dburl.py reads it) for the test database of ``alias``."""
    s = connections[alias].settings_dict
    user, password = quote(s["USER"] or "", safe=""), quote(s["PASSWORD"] or "", safe="")
    auth = f"{user}:{password}@" if user or password else ""
    host = s["HOST"] or ""
    port = f":{s['PORT']}" if s["PORT"] else ""
    query = {k: str(v) for k, v in (s.get("OPTIONS") or {}).items()}
    if host.startswith("/"):  # a Unix socket directory: libpq's ?host= form
        query["host"] = host
        host = ""
    elif ":" in host:  # an IPv6 address
        host = f"[{host}]"
    url = f"postgresql://{auth}{host}{port}/{quote(s['NAME'], safe='')}"
    return f"{url}?{urlencode(query)}" if query else url


@dataclass
class WorkerProcess:
    """One ``runworker`` subprocess (the leader of its own process group)."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float) -> int:
        """The exit status; fails the test if the process is still running after ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} (pid {self.pid}) still running after {timeout}s")

    def registered(self, timeout: float = STARTUP) -> str:
        """Wait for this process's pgqueue_worker row; returns the worker id."""
        row = wait_for(
            lambda: WorkerRow.objects.filter(pid=self.pid, stopped_at__isnull=True).first(),
            timeout,
            f"{self.name} (pid {self.pid}) to register in pgqueue_worker",
        )
        return row.id

    def dump_stacks(self) -> None:
        """If still running, have the process log every thread's stack (SIGUSR1)."""
        if self.proc.poll() is not None:
            return
        size = self.log_path.stat().st_size
        self.send(signal.SIGUSR1)  # tests/worker_settings.py registers faulthandler on it
        deadline = time.monotonic() + 2
        while b"most recent call first" not in self.log_path.read_bytes()[size:]:
            if time.monotonic() > deadline:
                return
            time.sleep(POLL)

    def kill_group(self) -> None:
        """SIGKILL the process and any children it started, and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()


StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def workers(transactional_db: None, tmp_path: Path) -> Iterator[StartWorker]:
    """``start(*runworker_args, settings={NAME: value}, name=..., url=...)`` starts a worker.

    ``settings`` become PGQUEUE_<NAME>=<JSON> (the test process's own PGQUEUE_* variables
    are not passed on); ``url`` replaces the test database's DATABASE_URL; ``extra_env`` adds
    variables, or replaces those above. At teardown
    every worker started is killed, before the test database is flushed, and its log is
    printed.
    """
    started: list[WorkerProcess] = []
    test_url = database_url()

    def start(
        *args: str,
        settings: dict[str, Any] | None = None,
        name: str | None = None,
        url: str | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        name = name or f"worker{len(started) + 1}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
        env.update(
            DJANGO_SETTINGS_MODULE="tests.worker_settings",
            DATABASE_URL=url or test_url,
            PYTHONUNBUFFERED="1",
        )
        env.update(extra_env or {})  # which may name other settings (DJANGO_SETTINGS_MODULE)
        for key, value in (settings or {}).items():
            env[f"PGQUEUE_{key}"] = json.dumps(value)
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "runworker", *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: teardown kills children too
            )
        worker = WorkerProcess(name, proc, log_path)
        started.append(worker)
        return worker

    yield start

    for worker in started:
        worker.dump_stacks()
        worker.kill_group()
    for worker in started:
        print(f"----- {worker.name}: pid {worker.pid}, exit status {worker.proc.returncode}")
        print("(a process still running at teardown logged its threads' stacks at the end)")
        print(worker.log())


def history(job_id: int) -> list[tuple[int, str, str]]:
    """The job's attempt rows as ``(attempt, outcome, worker)``, oldest first."""
    return list(
        JobAttempt.objects.filter(job_id=job_id)
        .order_by("id")
        .values_list("attempt", "outcome", "worker")
    )
