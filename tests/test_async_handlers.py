"""``async def`` handlers under ``@pgqueue.task``: awaited on the worker's event loop.

Real ``runworker`` subprocesses (tests/workers.py). Before async support the coroutine was
taken for the result and the job ended dead with "coroutine is not JSON serializable".
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import pgqueue
from pgqueue import services
from pgqueue.models import Job, JobAttempt
from tests.workers import STARTUP, StartWorker, wait_for


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


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "how", ["system_exit", "keyboard_interrupt", "stop_loop", "exit_in_callback"]
)
def test_an_async_handler_cannot_break_the_event_loop(workers: StartWorker, how: str) -> None:
    """A handler that raises SystemExit or KeyboardInterrupt, stops the running event
    loop, or has a callback raise SystemExit later costs only its own job.

    Protection: the worker's event loop thread runs the loop again whenever it stops
    without being asked to (``EventLoopThread._run``), and a handler's exception of any
    class is its job's outcome. Without it the loop is closed: the async job running
    beside the breaker never ends (its lease renewed for as long as the process lives),
    later async jobs die "Event loop is closed", and SIGTERM hangs.
    """
    w = workers("--concurrency", "2", settings={"POLL_SECONDS": 0.2})
    w.registered()
    beside, _ = pgqueue.enqueue("test.async_sleep", {"seconds": 1.0, "n": 1}, tenant="acme")
    breaker, _ = pgqueue.enqueue("test.async_breaker", {"how": how}, tenant="evil", max_attempts=1)
    both = Job.objects.filter(id__in=[beside.id, breaker.id])
    wait_for(
        lambda: set(both.values_list("status", flat=True)) <= {"done", "dead"},
        STARTUP,
        "the job beside the breaker and the breaker to end",
    )
    assert Job.objects.get(pk=beside.id).status == "done"
    row = Job.objects.get(pk=breaker.id)
    expected = {
        "system_exit": ("dead", "SystemExit: 5"),
        "keyboard_interrupt": ("dead", "KeyboardInterrupt"),
        "stop_loop": ("done", None),
        "exit_in_callback": ("done", None),
    }[how]
    assert (row.status, row.last_error) == expected
    if how in ("system_exit", "keyboard_interrupt"):
        assert "in async_breaker" in JobAttempt.objects.get(job_id=breaker.id).traceback

    after, _ = pgqueue.enqueue("test.async_add", {"a": 1, "b": 1}, tenant="acme")
    wait_for(lambda: Job.objects.get(pk=after.id).status == "done", 10, "a later async job")
    assert Job.objects.get(pk=after.id).result["sum"] == 2
    w.send(signal.SIGTERM)
    assert w.wait_exit(10) == 0


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_async_job_has_its_coroutine_cancelled_and_frees_its_slot(
    workers: StartWorker, tmp_path: Path
) -> None:
    """An async job cancelled while it awaits (never looking at ``job.cancelled``) has its
    coroutine cancelled, so its slot serves the next job at once.

    Protection: settling an attempt cancels its coroutine's future
    (``JobExecutor.settle``). Without it the coroutine sleeps on for 30 s holding the
    worker's only slot, and the next job waits for it.
    """
    begun, observed = tmp_path / "started", tmp_path / "observed"
    job, _ = pgqueue.enqueue(
        "test.async_until_cancelled",
        {"started": str(begun), "observed": str(observed), "timeout": 30},
        tenant="acme",
    )
    w = workers("--concurrency", "1", "--prefetch", "0", settings={"LEASE_SECONDS": 3})
    w.registered()
    wait_for(lambda: Path(f"{begun}.1").exists(), STARTUP, "the handler to start")
    services.cancel(job.id)
    wait_for(lambda: Job.objects.get(pk=job.id).status == "cancelled", 10, "the cancel")
    wait_for(lambda: Path(f"{observed}.CancelledError").exists(), 5, "the coroutine cancelled")
    nxt, _ = pgqueue.enqueue("test.async_add", {"a": 2, "b": 2}, tenant="acme")
    wait_for(lambda: Job.objects.get(pk=nxt.id).status == "done", 10, "the next job")
