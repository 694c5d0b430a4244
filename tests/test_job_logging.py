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
