"""Log records emitted while a job runs carry the job: id, task, tenant and attempt.

``pgqueue.log.JobContextFilter`` adds them to every record it sees (empty outside a job);
runworker's default logging (a project that configures no handler) shows a handler's INFO
records with them.
"""

from __future__ import annotations

import logging

import pytest

import pgqueue
from pgqueue.log import JobContextFilter
from pgqueue.models import Job
from pgqueue.worker.executor import JobExecutor, run_handler
from tests.conftest import claim
from tests.workers import STARTUP, StartWorker


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
