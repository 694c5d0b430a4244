"""``async def`` handlers under ``@pgqueue.task``: awaited on the worker's event loop.

Real ``runworker`` subprocesses (tests/workers.py). Before async support the coroutine was
taken for the result and the job ended dead with "coroutine is not JSON serializable".
"""

from __future__ import annotations

import pytest

import pgqueue
from pgqueue.models import Job, JobAttempt
from tests.workers import STARTUP, StartWorker


@pytest.mark.django_db(transaction=True)
def test_async_handler_result_and_error_are_recorded(workers: StartWorker) -> None:
    """An async task's return value is its result; its exception a failure (then dead)."""
    ok, _ = pgqueue.enqueue("test.async_add", {"a": 2, "b": 3}, tenant="acme")
    bad, _ = pgqueue.enqueue("test.async_fail", {"n": 7}, tenant="acme", max_attempts=1)
    w = workers("--burst")
    assert w.wait_exit(STARTUP) == 0
    row = Job.objects.get(pk=ok.id)
    assert (row.status, row.attempts, row.result) == (
        "done",
        1,
        {"sum": 5, "attempt": 1, "alive": True},
    )
    row = Job.objects.get(pk=bad.id)
    assert (row.status, row.attempts, row.last_error) == ("dead", 1, "ValueError: async failure 7")
    attempt = JobAttempt.objects.get(job_id=bad.id)
    assert "in async_fail" in attempt.traceback
    log_lines = [line for line in w.log().splitlines() if f"job={bad.id} " in line]
    assert any("outcome=dead" in line for line in log_lines), w.log()


@pytest.mark.django_db(transaction=True)
def test_async_handlers_overlap_up_to_the_concurrency(workers: StartWorker) -> None:
    """Four 0.5 s async sleeps with --concurrency 4 run at once; a fifth waits for a slot.

    Judged by when each handler began and ended its sleep, as recorded in the jobs'
    results, not by how fast the test ran: the four first all began before any of them
    ended (they overlapped), and the fifth began only after one of them ended (the slots
    bound async jobs as they bound threads). Each handler logs through the logging
    module, and its record carries its job on the event loop too.
    """
    ids = pgqueue.enqueue_many(
        "test.async_sleep", [{"seconds": 0.5, "n": n} for n in range(5)], tenant="acme"
    )
    w = workers("--burst", "--concurrency", "4")
    assert w.wait_exit(STARTUP) == 0
    rows = list(Job.objects.filter(id__in=ids))
    assert [r.status for r in rows] == ["done"] * 5
    runs = sorted((r.result for r in rows), key=lambda run: run["began"])
    first_four, fifth = runs[:4], runs[4]
    assert max(run["began"] for run in first_four) < min(run["ended"] for run in first_four)
    assert fifth["began"] >= min(run["ended"] for run in first_four)
    for row in rows:
        assert f"job={row.id} task=test.async_sleep tenant=acme attempt=1 async sleeper" in w.log()
