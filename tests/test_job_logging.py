"""Log records emitted while a job runs carry the job: id, task, tenant and attempt.

``pgqueue.log.JobContextFilter`` adds them to every record it sees (empty outside a job);
runworker's default logging (a project that configures no handler) shows a handler's INFO
records with them, and the Tasks framework's line per task start and end once, at the
verbosity asked for.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from django.test import override_settings

import pgqueue
from pgqueue.log import JobContextFilter
from pgqueue.models import Job
from pgqueue.worker.executor import JobExecutor, run_handler
from tests.conftest import claim
from tests.taskapp import django_tasks as t
from tests.test_tasks_backend import TASKS
from tests.workers import REPO, STARTUP, StartWorker


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(JobContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.django_db(transaction=True)
def test_records_inside_a_job_carry_it_and_others_do_not() -> None:
    """The filter reads the job the current thread is running, set around the handler."""
    job, _ = pgqueue.enqueue("test.log", {"word": "hi"}, tenant="acme")
    (claimed,) = claim("w")
    executor = JobExecutor(1, worker_id="w", heartbeat=lambda _t: None, deliver=lambda _o: None)
    ctx = executor.context(claimed)
    handler = Records()
    task_logger = logging.getLogger("tests.taskapp.tasks")
    task_logger.addHandler(handler)
    task_logger.setLevel(logging.INFO)
    try:
        assert run_handler(ctx).ok
        task_logger.info("outside any job")
    finally:
        task_logger.removeHandler(handler)
        task_logger.setLevel(logging.NOTSET)
        executor.shutdown()
    inside, outside = handler.records
    assert inside.getMessage() == "handler says hi"
    assert (
        inside.pgqueue_job_id,
        inside.pgqueue_task,
        inside.pgqueue_tenant,
        inside.pgqueue_attempt,
    ) == (job.id, "test.log", "acme", 1)
    assert inside.pgqueue_job == f"job={job.id} task=test.log tenant=acme attempt=1 "
    assert (outside.pgqueue_job_id, outside.pgqueue_task, outside.pgqueue_job) == ("", "", "")


@pytest.mark.django_db(transaction=True)
def test_runworker_shows_a_handlers_info_record_with_its_job(workers: StartWorker) -> None:
    """With no logging configured for them, a handler's logger.info reaches the worker's output.

    Before the fix the record went nowhere (no handler, and Python's last resort prints
    warnings only); now its line holds the job's id, task, tenant and attempt.
    """
    job, _ = pgqueue.enqueue("test.log", {"word": "hello-from-the-handler"}, tenant="acme")
    w = workers("--burst")
    assert w.wait_exit(STARTUP) == 0
    assert Job.objects.get(pk=job.id).status == "done"
    lines = [line for line in w.log().splitlines() if "hello-from-the-handler" in line]
    assert len(lines) == 1, w.log()
    assert "level=INFO logger=tests.taskapp.tasks" in lines[0]
    assert f"job={job.id} task=test.log tenant=acme attempt=1 handler says" in lines[0]


@pytest.mark.django_db(transaction=True)
def test_runworker_logs_a_line_per_batch_and_a_warning_per_failure(workers: StartWorker) -> None:
    """At INFO a recorded batch is one line with its counts and ids, not one per job; each
    failure still has a WARNING line of its own, with its job id and error."""
    ok = pgqueue.enqueue_many("test.echo", [{"n": n} for n in range(6)], tenant="acme")
    bad, _ = pgqueue.enqueue("test.fail_until", {"succeed_on": 9}, tenant="acme", max_attempts=1)
    w = workers("--burst")
    assert w.wait_exit(STARTUP) == 0
    lines = w.log().splitlines()
    batches = [line for line in lines if "event=recorded" in line]
    assert batches and all("level=INFO" in line for line in batches), w.log()
    assert sum(int(line.split(" jobs=")[1].split()[0]) for line in batches) == 7
    named = {int(i) for line in batches for i in line.split(" ids=")[1].split(",")}
    assert named == {*ok, bad.id}
    assert not [line for line in lines if "outcome=done" in line], w.log()
    (failure,) = [line for line in lines if f"job={bad.id} " in line and "outcome=" in line]
    assert "level=WARNING" in failure and "outcome=dead" in failure
    assert "error='RuntimeError: failing on purpose on attempt 1'" in failure


#: runworker's logging set up as it sets it up, then a line of Django's "django.tasks"
#: logger at INFO and one at WARNING (Django 6 logs a task's start and end there at INFO).
DJANGO_TASKS_LINES = """
import logging, sys
import django
django.setup()
from pgqueue.management.commands.runworker import _configure_logging
_configure_logging(int(sys.argv[1]))
logging.getLogger("django.tasks").info("Task id=1 path=a.b state=SUCCESSFUL")
logging.getLogger("django.tasks").warning("Task id=2 path=a.b state=FAILED")
"""


@pytest.mark.parametrize("debug", ["0", "1"])
@pytest.mark.parametrize("verbosity, shown", [(0, ["2"]), (1, ["1", "2"]), (2, ["1", "2"])])
def test_django_tasks_lines_show_once_and_only_at_the_verbosity_asked(
    debug: str, verbosity: int, shown: list[str]
) -> None:
    """Django's logging puts "django.tasks" under its "django" logger, set to INFO with a
    console handler of its own under DEBUG=True: the INFO lines got past -v 0 (the
    logger's level decides, not the root's) and, with DEBUG, each was printed twice."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(DJANGO_SETTINGS_MODULE="tests.worker_settings", DEBUG=debug)
    done = subprocess.run(
        [sys.executable, "-c", DJANGO_TASKS_LINES, str(verbosity)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "Task id=" in line]
    assert [line.split("Task id=")[1][0] for line in lines] == shown, lines
    assert all(" logger=django.tasks Task id=" in line for line in lines), lines


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("verbosity, per_task", [("0", 0), ("1", 2)])
def test_runworker_logs_a_django_tasks_start_and_end_once_each_as_verbose_as_asked(
    workers: StartWorker, verbosity: str, per_task: int
) -> None:
    """A task of Django's Tasks framework run by ``runworker --burst -v N`` with DEBUG=True:
    the framework's lines (its task started, its task finished) once each at -v 1, none at
    -v 0, which shows warnings only."""
    with override_settings(TASKS=TASKS):
        result = t.noop.enqueue()
    w = workers("--burst", "-v", verbosity, settings={"TASKS": TASKS}, extra_env={"DEBUG": "1"})
    assert w.wait_exit(STARTUP) == 0, w.log()
    assert Job.objects.get(pk=int(result.id)).status == "done"
    lines = [line for line in w.log().splitlines() if f"Task id={result.id} " in line]
    assert len(lines) == per_task, w.log()
    assert all("level=INFO logger=django" in line for line in lines), lines
