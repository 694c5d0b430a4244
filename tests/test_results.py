"""Waiting for a job's result: ``pgqueue.result(job_id, timeout)`` and ``Job.wait``.

Real PostgreSQL, committed data, real workers (tests/workers.py) where a job must run. A
wait is woken by the notification of the statement that ends its job
(tests/test_results_notify.py shows each statement sends it); the safety re-read
(RESULT_RECHECK_SECONDS) is set far longer than any bound here unless a test is about it,
so a wait that returns within the bound was woken by its notification.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

import pgqueue
from pgqueue import services, store
from pgqueue.models import Job
from pgqueue.results import Waiter
from tests.workers import STARTUP, StartWorker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: A safety re-read no wait here reaches: only a notification can end one in time.
NO_RECHECK = {"RESULT_RECHECK_SECONDS": 600}
#: A short lease, quick maintenance and a tiny backoff, for the workers.
SHORT = {"LEASE_SECONDS": 3, "MAINTENANCE_SECONDS": 0.2, "BACKOFF_BASE": 0.05}


class Waiting:
    """A wait on a thread of its own: ``outcome`` is what it returned or raised."""

    def __init__(self, job_id: int, timeout: float = 60, **kwargs: Any) -> None:
        self.waiter = Waiter(job_id, **kwargs)
        self.outcome: Any = None
        self.thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self.thread.start()

    def _run(self, timeout: float) -> None:
        try:
            self.outcome = self.waiter.wait(timeout)
        except Exception as exc:  # the test asserts on it
            self.outcome = exc

    def listening(self, bound: float = 10) -> None:
        """Until the wait has read its job once: it listens (it LISTENs before it reads)."""
        wait_for(lambda: self.waiter.reads >= 1, bound, f"the wait for {self.waiter.job_id}")

    def result(self, bound: float = 30) -> Any:
        """What the wait returned or raised, once it ends (fails after ``bound`` s)."""
        self.thread.join(bound)
        assert not self.thread.is_alive(), f"the wait for {self.waiter.job_id} is still asleep"
        return self.outcome


def claim_all(count: int) -> list[store.ClaimedJob]:
    with connection.cursor() as cur:
        held = store.claim(cur, worker="w1", queues=["default"], limit=count)
    assert len(held) == count
    return held


# -- what a wait returns or raises ----------------------------------------------------------


def test_the_result_of_a_done_job(workers: StartWorker) -> None:
    """``job.wait()`` on what ``pgqueue.enqueue`` returned, and ``pgqueue.result`` by id."""
    job, created = pgqueue.enqueue("test.echo", {"words": ["a", "b"]}, tenant="acme")
    assert created
    workers("--concurrency", "2")
    with override_settings(PGQUEUE=NO_RECHECK):
        assert job.wait(timeout=STARTUP + 30) == {"words": ["a", "b"]}
        assert pgqueue.result(job.id, timeout=0) == {"words": ["a", "b"]}  # ended: at once


def test_a_handler_that_returned_nothing_gives_none(workers: StartWorker) -> None:
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    workers("--concurrency", "1")
    with override_settings(PGQUEUE=NO_RECHECK):
        assert pgqueue.result(job.id, timeout=STARTUP + 30) is None


def test_a_permanent_error_raises_job_failed_with_the_status_and_error(
    workers: StartWorker,
) -> None:
    job, _ = pgqueue.enqueue("test.permanent", {"reason": "bad input"}, tenant="acme")
    workers("--concurrency", "1")
    with override_settings(PGQUEUE=NO_RECHECK), pytest.raises(pgqueue.JobFailed) as failed:
        job.wait(timeout=STARTUP + 30)
    assert (failed.value.job_id, failed.value.status) == (job.id, "dead")
    assert "PermanentError: bad input" in failed.value.last_error
    assert isinstance(failed.value, pgqueue.PgQueueError)
    assert str(failed.value).startswith(f"job {job.id} ended dead: ")


def test_a_wait_goes_on_through_retries_to_the_attempt_that_succeeds(
    workers: StartWorker,
) -> None:
    """A failure that will be retried does not end the job (no notification, the wait
    sleeps on); the result is the second attempt's."""
    job, _ = pgqueue.enqueue("test.fail_until", {"succeed_on": 2}, tenant="acme")
    workers("--concurrency", "1", settings=SHORT)
    with override_settings(PGQUEUE=NO_RECHECK):
        assert job.wait(timeout=STARTUP + 30) == {"attempt": 2}


def test_cancelling_a_queued_job_raises_job_failed_in_its_waiters() -> None:
    """JOB_CANCEL_MANY's notification wakes the wait (no worker runs)."""
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    with override_settings(PGQUEUE=NO_RECHECK):
        waiting = Waiting(job.id)
        waiting.listening()
        services.cancel(job.id)
        failed = waiting.result()
    assert isinstance(failed, pgqueue.JobFailed), failed
    assert (failed.job_id, failed.status, failed.last_error) == (job.id, "cancelled", None)


def test_cancelling_a_running_job_raises_job_failed_in_its_waiters(
    workers: StartWorker, tmp_path: Path
) -> None:
    """The worker ends the attempt (JOB_CANCEL_CONFIRM_MANY); its notification wakes the wait."""
    begun = tmp_path / "started"
    job, _ = pgqueue.enqueue("test.until_cancelled", {"started": str(begun)}, tenant="acme")
    workers("--concurrency", "1", settings=SHORT)
    with override_settings(PGQUEUE=NO_RECHECK):
        waiting = Waiting(job.id)
        wait_for(lambda: Path(f"{begun}.1").exists(), STARTUP, "the handler to start")
        services.cancel(job.id)
        failed = waiting.result()
    assert isinstance(failed, pgqueue.JobFailed), failed
    assert (failed.job_id, failed.status) == (job.id, "cancelled")
    assert failed.last_error is None  # cancelled on request: no error of the job's own


def test_a_timeout_with_no_worker_raises_result_timeout_after_the_timeout() -> None:
    """No worker: the job stays queued, and the wait gives up once its timeout has passed
    (not before; and it is not left asleep until the next safety re-read)."""
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    with override_settings(PGQUEUE=NO_RECHECK):
        began = time.monotonic()
        with pytest.raises(pgqueue.ResultTimeout) as timed_out:
            pgqueue.result(job.id, timeout=0.5)
        waited = time.monotonic() - began
    assert 0.5 <= waited < 0.5 + 30  # the bound only catches a wait left to the re-read
    assert isinstance(timed_out.value, TimeoutError)
    assert (timed_out.value.job_id, timed_out.value.status) == (job.id, "queued")
    with pytest.raises(TimeoutError):  # 0: one look
        job.wait(timeout=0)


def test_an_unknown_job_raises_job_not_found() -> None:
    with pytest.raises(pgqueue.JobNotFound, match="job 123456789 does not exist"):
        pgqueue.result(123456789, timeout=1)
    with pytest.raises(pgqueue.JobNotFound):
        pgqueue.result(0)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"job_id": "x"}, "job_id"),
        ({"job_id": True}, "job_id"),
        ({"job_id": 1, "timeout": -1}, "timeout"),
        ({"job_id": 1, "timeout": "10"}, "timeout"),
        ({"job_id": 1, "timeout": float("nan")}, "timeout"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        pgqueue.result(**kwargs)


# -- the transaction that enqueued the job --------------------------------------------------


def test_waiting_inside_the_enqueuing_transaction_raises_at_once() -> None:
    """The job is not committed: no worker (nor the wait's own connection) can see it, so
    the wait would never end. It raises JobNotCommitted, not a timeout after 60 s."""
    with transaction.atomic():
        job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
        with pytest.raises(pgqueue.JobNotCommitted, match="open transaction") as raised:
            job.wait(timeout=60)
    assert raised.value.job_id == job.id
    assert Job.objects.filter(pk=job.id).exists()  # the transaction itself went on


def test_waiting_inside_a_later_transaction_for_a_committed_job_works() -> None:
    """A transaction open on Django's connection does not matter to a committed job: the
    wait reads and listens on a connection of its own."""
    job, _ = pgqueue.enqueue("test.echo", {"n": 1}, tenant="acme")
    (held,) = claim_all(1)
    with connection.cursor() as cur:
        store.complete_many(cur, worker="w1", results=[(held.id, held.attempt, '{"n": 1}')])
    with transaction.atomic():
        assert job.wait(timeout=10) == {"n": 1}


# -- how a wait is woken --------------------------------------------------------------------


def test_twenty_waiters_are_woken_by_one_statement() -> None:
    """20 waits, each for one of 20 jobs, all asleep; one JOB_COMPLETE_MANY ends the 20
    and its one notification wakes all of them, each with its own result.

    Proves the batch notification reaches every waiter and each finds its id in it: with
    the safety re-read set to 600 s, a wait not woken would still be asleep at the 30 s
    bound. Each read its job twice: once when it began, once when woken (no polling).
    """
    jobs = pgqueue.enqueue_many("test.echo", [{"i": i} for i in range(20)], tenant="acme")
    with override_settings(PGQUEUE=NO_RECHECK):
        waits = [Waiting(job_id) for job_id in jobs]
        for waiting in waits:
            waiting.listening()
        held = claim_all(20)
        with connection.cursor() as cur:
            done = store.complete_many(
                cur, worker="w1", results=[(j.id, j.attempt, f'{{"i": {j.id}}}') for j in held]
            )
        assert done == set(jobs)
        outcomes = [waiting.result() for waiting in waits]
    assert outcomes == [{"i": job_id} for job_id in jobs]
    assert [(w.waiter.reads, w.waiter.wakeups) for w in waits] == [(2, 1)] * 20


def test_a_wait_is_woken_by_the_notification_not_by_polling(
    workers: StartWorker, tmp_path: Path
) -> None:
    """A job of a real worker, held running until the test releases it: the wait sleeps
    (one read), and returns once the worker's turn records the job (JOB_COMPLETE_MANY in
    the turn's transaction), after a second read.

    Proves the wake-up is the notification: the safety re-read is 600 s away, and the wait
    returns within the 30 s bound; and that nothing polls: the job was read twice in all
    while it ran for as long as the test held it.
    """
    begun, release = tmp_path / "started", tmp_path / "release"
    job, _ = pgqueue.enqueue(
        "test.block", {"started": str(begun), "release": str(release)}, tenant="acme"
    )
    workers("--concurrency", "1")
    with override_settings(PGQUEUE=NO_RECHECK):
        waiting = Waiting(job.id)
        waiting.listening()
        wait_for(lambda: Path(f"{begun}.1").exists(), STARTUP, "the handler to start")
        assert (waiting.waiter.reads, waiting.thread.is_alive()) == (1, True)
        release.touch()
        assert waiting.result()["attempt"] == 1
    assert (waiting.waiter.reads, waiting.waiter.wakeups) == (2, 1)


def test_an_end_that_sent_no_notification_is_found_by_the_safety_reread() -> None:
    """A job ended by a statement that notified nothing (here a plain UPDATE, as a worker
    of an older release would record it): the wait finds it at its next re-read.

    Proves the safety net (RESULT_RECHECK_SECONDS): without it the wait would sleep until
    its timeout (60 s) and raise ResultTimeout, past the 30 s bound."""
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    with override_settings(PGQUEUE={"RESULT_RECHECK_SECONDS": 0.2}):
        waiting = Waiting(job.id, timeout=60)
        waiting.listening()
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE pgqueue_job SET status = 'done', result = '7', finished_at = now() "
                "WHERE id = %s",
                [job.id],
            )
        assert waiting.result() == 7
    assert waiting.waiter.wakeups == 0 and waiting.waiter.reads >= 2


def test_a_wait_whose_connection_is_lost_listens_again_and_still_returns() -> None:
    """The wait's connection is ended by the server while it sleeps; it connects again,
    LISTENs, and reads the job again (the end may have come while it was away)."""
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    with override_settings(PGQUEUE=NO_RECHECK):
        waiting = Waiting(job.id)
        waiting.listening()
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                [f"pgqueue result {job.id}"],
            )
            assert cur.fetchone()[0] == 1
        wait_for(lambda: waiting.waiter.reads >= 2, 30, "the wait to read the job again")
        (held,) = claim_all(1)
        with connection.cursor() as cur:
            store.complete_many(cur, worker="w1", results=[(held.id, held.attempt, '"back"')])
        assert waiting.result() == "back"
