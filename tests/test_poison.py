"""No outcome of a handler stops a worker or costs another job its recorded outcome.

A handler can return or raise anything: text with NUL characters or lone surrogates (which
PostgreSQL refuses), values JSON cannot hold, results far too large, exceptions whose
``str()`` itself raises. Each such job must end as a failed attempt with an error that says
why, while the good jobs recorded in the same statement stay recorded and the worker runs on.
Workers are real ``runworker`` subprocesses (see tests/workers.py), except where a test
needs to hand the loop an outcome no handler can produce.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from django.test import override_settings
from django.utils import timezone

import pgqueue
from pgqueue import checks, store
from pgqueue.models import Job, JobAttempt
from pgqueue.worker import WorkerLoop
from pgqueue.worker.executor import HandlerOutcome
from tests.workers import STARTUP, StartWorker, wait_for

#: kind of poison -> what the job's last_error must hold (every fragment, in order).
POISONS: dict[str, tuple[str, ...]] = {
    "nul_result": ("result not storable: ", "NUL"),
    "surrogate_result": ("result not storable: ", "surrogate"),
    "set_result": ("result not storable: ", "not JSON-serialisable", "set"),
    "object_result": ("result not storable: ", "not JSON-serialisable", "object"),
    "nan_result": ("result not storable: ", "NaN or Infinity"),
    "infinity_result": ("result not storable: ", "NaN or Infinity"),
    "big_result": ("result not storable: ", "5002 bytes", "MAX_RESULT_BYTES", "1000"),
    "deep_result": ("result not storable: ", "nested more than 100 levels", "MAX_JSON_DEPTH"),
    "nul_error": ("RuntimeError: a\\x00b",),
    "surrogate_error": ("RuntimeError: bad \\udcff text",),
    "unprintable_error": (
        "tests.taskapp.tasks._UnprintableError: <str() raised ValueError: ",
        "no text for this exception>",
    ),
    "huge_error": ("RuntimeError: eeee", "[truncated]"),
}


def holds_in_order(text: str, fragments: tuple[str, ...]) -> bool:
    at = 0
    for fragment in fragments:
        found = text.find(fragment, at)
        if found < 0:
            return False
        at = found + len(fragment)
    return True


@pytest.mark.django_db(transaction=True)
def test_poison_outcomes_fail_their_own_job_only(workers: StartWorker) -> None:
    """Good jobs of two tenants interleaved with every kind of poison, all in one burst.

    Eight slots, so each recording statement carries good and poison outcomes together:
    before the fix the first NUL made the whole statement fail, the worker exited 1 and the
    good jobs of that statement ran again. Now the burst exits 0, every good job is done at
    its first attempt, and every poison job (one attempt allowed) is dead with an error
    naming its cause, stored in text PostgreSQL accepts and within the stated bounds.
    """
    good: list[int] = []
    poison: dict[str, int] = {}
    for i, kind in enumerate(POISONS):
        for tenant in ("acme", "globex"):
            job, _ = pgqueue.enqueue("test.echo", {"n": i, "tenant": tenant}, tenant=tenant)
            good.append(job.id)
        job, _ = pgqueue.enqueue("test.poison", {"kind": kind}, tenant="evil", max_attempts=1)
        poison[kind] = job.id

    w = workers("--burst", "--concurrency", "8", settings={"MAX_RESULT_BYTES": 1000})
    assert w.wait_exit(60) == 0

    rows = {row.id: row for row in Job.objects.filter(id__in=[*good, *poison.values()])}
    for job_id in good:
        row = rows[job_id]
        assert (row.status, row.attempts, row.result) == ("done", 1, row.payload), job_id
    for kind, fragments in POISONS.items():
        row = rows[poison[kind]]
        assert (row.status, row.attempts) == ("dead", 1), kind
        assert row.result is None, kind
        assert holds_in_order(row.last_error, fragments), (kind, row.last_error)
        assert "\x00" not in row.last_error and len(row.last_error.encode()) <= 4096, kind
        attempt = JobAttempt.objects.get(job_id=row.id)
        assert (attempt.outcome, attempt.error) == ("failed", row.last_error), kind
        assert len((attempt.traceback or "").encode()) <= 65536, kind
    tracebacks = dict(
        JobAttempt.objects.filter(job_id__in=poison.values()).values_list("job_id", "traceback")
    )
    assert "RuntimeError: a\\x00b" in tracebacks[poison["nul_error"]]
    assert "[truncated]" in tracebacks[poison["huge_error"]]
    assert "event=worker_stopped" in w.log()


@pytest.mark.django_db(transaction=True)
def test_a_statement_the_database_refuses_is_recorded_row_by_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch the database refuses for a reason the worker did not foresee is split up.

    In-process, with the loop's own methods: the outcomes are handed to the loop directly
    with JSON text the executor would never produce (an escaped NUL, which jsonb refuses),
    standing in for any refusal nobody has thought of yet. First a turn of successes only
    (the fused record-and-claim statement), then a turn with a failure whose error holds a
    raw NUL. Each time the good outcomes are recorded, the offender is logged at ERROR with
    its id and recorded as a failed attempt with an error that can be stored, and the loop
    goes on (the next turn claims again).
    """
    ids = pgqueue.enqueue_many("test.noop", list(range(6)), tenant="acme", queue="q")
    worker = WorkerLoop(queues=["q"], concurrency=3)
    try:
        worker._connect_until_up()
        assert worker.db is not None
        with worker.db.cursor() as cur:
            claimed = store.claim(
                cur, worker=worker.id, queues=worker.queues, limit=3, lease_seconds=worker.lease
            )
        ctxs = {ctx.id: ctx for ctx in (worker.executor.context(job) for job in claimed)}
        first, bad, third = (ctxs[i] for i in ids[:3])
        worker.pending = [
            HandlerOutcome(first, ok=True, result_json='{"ok":1}'),
            HandlerOutcome(bad, ok=True, result_json='"a\\u0000b"'),
            HandlerOutcome(third, ok=True, result_json=None),
        ]
        with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
            worker._turn()
        rows = {r.id: r for r in Job.objects.filter(id__in=ids)}
        assert (rows[first.id].status, rows[first.id].result) == ("done", {"ok": 1})
        assert rows[third.id].status == "done"
        assert rows[bad.id].status == "scheduled"  # failed, to be retried after its backoff
        assert rows[bad.id].last_error.startswith("outcome not storable: ")
        assert any(
            r.levelno == logging.ERROR and f"job={bad.id}" in r.getMessage() for r in caplog.records
        )

        # The loop goes on: the next turn claims the three jobs still queued.
        worker._turn()
        assert set(worker.in_flight) <= set(ids[3:])
        wait_for(lambda: worker.outcomes.qsize() == 3, 10, "the next three jobs to run")
        worker._take_outcomes()
        nul_error = worker.pending[0]
        nul_error.ok, nul_error.error, nul_error.traceback = False, "boom\x00", "tb\x00"
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
            worker._turn()
        rows = {r.id: r for r in Job.objects.filter(id__in=ids[3:])}
        statuses = sorted(r.status for r in rows.values())
        assert statuses == ["done", "done", "scheduled"]
        assert rows[nul_error.ctx.id].last_error.startswith("outcome not storable: ")
        assert any(f"job={nul_error.ctx.id}" in r.getMessage() for r in caplog.records)
    finally:
        worker._shutdown()


@pytest.mark.django_db(transaction=True)
def test_an_error_in_maintenance_does_not_stop_the_worker(workers: StartWorker) -> None:
    """A data error in maintenance is logged with its traceback; the worker runs on.

    A job whose lease expired after its second attempt, under a ``BACKOFF_BASE`` of 1e308,
    makes the reaper's backoff (base * 2) overflow float8, so every maintenance pass fails
    (its transaction rolls back, promotion with it) while that job is there. (The poison
    used to be a tenant weight of 1e-308, which the weight bounds now refuse.) Before the
    fix the worker exited 1 on the first pass. Now other work still runs, the error is in
    the log with its traceback, and once the job is out of the way the next pass promotes
    the delayed jobs.
    """
    delayed_ids = pgqueue.enqueue_many("test.noop", [1, 2], tenant="tiny", delay=0.2)
    poison, _ = pgqueue.enqueue("test.noop", {}, tenant="tiny")
    expired = timezone.now() - dt.timedelta(hours=1)
    Job.objects.filter(pk=poison.id).update(
        status="running",
        attempts=2,
        lease_owner="gone",
        lease_expires_at=expired,
        claimed_at=expired,
        started_at=expired,  # recorded: its loss spends an attempt, with a backoff
    )
    w = workers(settings={"MAINTENANCE_SECONDS": 0.1, "POLL_SECONDS": 0.1, "BACKOFF_BASE": 1e308})
    w.registered()
    wait_for(lambda: "event=maintenance_error" in w.log(), 20, "a failed maintenance pass")
    assert "Traceback (most recent call last)" in w.log()
    job, _ = pgqueue.enqueue("test.noop", {}, tenant="acme")
    wait_for(lambda: Job.objects.get(pk=job.id).status == "done", STARTUP, "a job to run after it")
    assert w.proc.poll() is None
    assert list(Job.objects.filter(id__in=delayed_ids).values_list("status", flat=True)) == [
        "scheduled",
        "scheduled",
    ]

    Job.objects.filter(pk=poison.id).update(
        status="cancelled", lease_owner=None, lease_expires_at=None
    )
    wait_for(
        lambda: Job.objects.filter(id__in=delayed_ids, status="done").count() == 2,
        STARTUP,
        "the delayed jobs, once the poisoned job is out of the way",
    )


@pytest.mark.parametrize("value", [0, 1, 2.5, "1MiB", True])
def test_max_result_bytes_must_be_an_integer_of_at_least_2(value: object) -> None:
    with override_settings(PGQUEUE={"MAX_RESULT_BYTES": value}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["pgqueue.E003"]
    assert "MAX_RESULT_BYTES" in errors[0].msg
