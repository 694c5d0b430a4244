"""The notifications that wake the callers waiting for results: every statement that ends
a job (done, dead, cancelled) notifies ``pgqueue_finished`` with the ids it ended, on
commit; a failure that will be retried, a snooze and a rolled-back end notify nothing.

Real PostgreSQL, committed data (notifications are delivered on commit only). A test
listens on its own connection, runs the statement as the worker, maintenance or an
operator runs it, and reads what arrived. "Nothing was sent for X" is shown without
waiting out a window: after X the test ends a marker job, and the next notification,
delivered in commit order, names the marker alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

import pgqueue
from pgqueue import claim_store, services, stop_store, store
from pgqueue.claim_store import Success
from pgqueue.results import FINISHED_CHANNEL
from pgqueue.worker.connection import connect_params
from tests.conftest import later

pytestmark = pytest.mark.django_db(transaction=True)


class Finished:
    """A connection listening on pgqueue_finished, as a waiter's does."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def next(self, count: int = 1, timeout: float = 10.0) -> list[str]:
        """The payloads of the next ``count`` notifications (fails after ``timeout``)."""
        notes = list(self.conn.notifies(timeout=timeout, stop_after=count))
        assert len(notes) >= count, f"{len(notes)} of {count} notifications in {timeout}s"
        assert {n.channel for n in notes} == {FINISHED_CHANNEL}
        return [n.payload for n in notes]

    def next_ids(self) -> set[int]:
        """The ids of the next notification."""
        (payload,) = self.next()
        return ids(payload)


def ids(payload: str) -> set[int]:
    return {int(i) for i in payload.split(",")}


@contextlib.contextmanager
def listening() -> Iterator[Finished]:
    with psycopg.connect(**connect_params(), autocommit=True) as conn:
        conn.execute("LISTEN pgqueue_finished")
        yield Finished(conn)


def claim(count: int = 1, worker: str = "w1", limit: int | None = None) -> list[store.ClaimedJob]:
    with connection.cursor() as cur:
        held = store.claim(cur, worker=worker, queues=["default"], limit=limit or count)
    assert len(held) == count
    return held


def complete(jobs: list[store.ClaimedJob], worker: str = "w1") -> set[int]:
    with connection.cursor() as cur:
        return store.complete_many(
            cur, worker=worker, results=[Success(j.id, j.attempt, '{"ok": true}') for j in jobs]
        )


def fail(job: store.ClaimedJob, *, permanent: bool = False, snooze: float | None = None) -> str:
    with connection.cursor() as cur:
        return store.fail_many(
            cur,
            worker="w1",
            failures=[
                store.Failure(
                    job.id, job.attempt, "RuntimeError: boom", None, permanent, snooze=snooze
                )
            ],
        )[job.id]


def started(cur: Any, jobs: list[store.ClaimedJob]) -> None:
    """Write the jobs' handlers' start, as the worker's heartbeat round does."""
    store.heartbeat_flags(
        cur,
        worker="w1",
        held=[(j.id, j.attempt) for j in jobs],
        started={j.id: later(0) for j in jobs},
    )


def marker() -> int:
    """End a job of its own (done), whose notification follows anything sent before it."""
    job, _ = pgqueue.enqueue("test.noop", None, tenant="marker", queue="marker")
    with connection.cursor() as cur:
        (held,) = store.claim(cur, worker="m", queues=["marker"], limit=1)
        assert store.complete_many(cur, worker="m", results=[(held.id, held.attempt, None)])
    return job.id


def test_a_batch_of_successes_sends_one_notification_naming_every_job() -> None:
    """JOB_COMPLETE_MANY (the recorder's batches) notifies once per statement, not per job."""
    pgqueue.enqueue_many("test.noop", [None] * 5, tenant="acme")
    with listening() as finished:
        held = claim(5)
        assert complete(held) == {j.id for j in held}
        assert finished.next_ids() == {j.id for j in held}
        ended = marker()  # the next notification: none other for the batch
        assert finished.next_ids() == {ended}


def test_the_turn_of_the_worker_notifies_its_successes() -> None:
    """The steady state: a worker's turn (claim_store.turn, pipelined, one transaction)
    records its successes with JOB_COMPLETE_MANY; they are notified when it commits."""
    pgqueue.enqueue_many("test.noop", [None] * 3, tenant="acme")
    held = claim(3)
    with (
        listening() as finished,
        psycopg.connect(**connect_params(), autocommit=True) as db,
    ):
        turn = claim_store.turn(
            db,
            worker="w1",
            queues=["default"],
            limit=1,
            successes=[Success(j.id, j.attempt, None) for j in held],
        )
        assert turn.recorded == {j.id for j in held}
        assert finished.next_ids() == {j.id for j in held}


def test_a_permanent_failure_is_notified_and_a_retried_one_is_not() -> None:
    """JOB_FAIL_MANY notifies the jobs it makes dead only: a job scheduled for another
    attempt, or snoozed, has not ended."""
    pgqueue.enqueue_many("test.noop", [None] * 3, tenant="acme")
    retried, snoozed, doomed = claim(3)
    with listening() as finished:
        assert fail(retried) == "scheduled"
        assert fail(snoozed, snooze=60) == "snoozed"
        ended = marker()
        assert finished.next_ids() == {ended}
        assert fail(doomed, permanent=True) == "dead"
        assert finished.next_ids() == {doomed.id}


def test_the_last_attempt_failing_is_notified() -> None:
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme", max_attempts=1)
    (held,) = claim()
    with listening() as finished:
        assert fail(held) == "dead"
        assert finished.next_ids() == {job.id}


def test_an_operator_cancel_notifies_the_waiting_jobs_it_cancels_on_commit() -> None:
    """JOB_CANCEL_MANY (services.cancel_jobs: admin, HTTP API, CLI, Python): queued and
    scheduled jobs cancelled in one statement, one notification, sent when the action's
    transaction commits and not before."""
    queued, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    scheduled, _ = pgqueue.enqueue("test.noop", None, tenant="acme", delay=600)
    with listening() as finished:
        with transaction.atomic():
            result = services.cancel_jobs([queued.id, scheduled.id])
            assert sorted(result.changed) == sorted([queued.id, scheduled.id])
            assert list(finished.conn.notifies(timeout=0)) == []  # not before the commit
        assert finished.next_ids() == {queued.id, scheduled.id}


def test_a_rolled_back_cancel_notifies_nothing() -> None:
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    with listening() as finished:
        with contextlib.suppress(RuntimeError), transaction.atomic():
            services.cancel_jobs([job.id])
            raise RuntimeError("roll back")
        ended = marker()
        assert finished.next_ids() == {ended}


def test_a_running_job_cancelled_by_its_worker_is_notified() -> None:
    """JOB_CANCEL_CONFIRM_MANY: the worker ends the attempt of a job asked to stop. The
    request itself (JOB_CANCEL_REQUEST_MANY) ends nothing and notifies nothing here."""
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    (held,) = claim()
    with listening() as finished:
        services.cancel_jobs([job.id])
        ended = marker()
        assert finished.next_ids() == {ended}
        with connection.cursor() as cur:
            assert stop_store.confirm_cancel_many(
                cur, worker="w1", held=[(held.id, held.attempt)]
            ) == {job.id}
        assert finished.next_ids() == {job.id}


def test_maintenance_cancelling_an_abandoned_job_is_notified() -> None:
    """JOB_REAP_CANCELLED: asked to stop, its worker gone, its lease out."""
    job, _ = pgqueue.enqueue("test.noop", None, tenant="acme")
    claim()
    services.cancel_jobs([job.id])
    with listening() as finished, connection.cursor() as cur:
        assert stop_store.reap_cancelled(cur, now=later(3600)) == [job.id]
        assert finished.next_ids() == {job.id}


def test_maintenance_timing_out_a_last_attempt_is_notified_and_an_earlier_one_is_not() -> None:
    """JOB_REAP_TIMED_OUT: dead on the last attempt (notified), scheduled before it (not)."""
    last, _ = pgqueue.enqueue("test.noop", None, tenant="acme", timeout=1, max_attempts=1)
    retried, _ = pgqueue.enqueue("test.noop", None, tenant="acme", timeout=1, max_attempts=3)
    held = claim(2)
    with connection.cursor() as cur:  # their handlers began (the heartbeat writes it)
        started(cur, held)
    with listening() as finished, connection.cursor() as cur:
        assert stop_store.reap_timed_out(cur, grace=1, now=later(3600)) == {
            last.id: "dead",
            retried.id: "scheduled",
        }
        assert finished.next_ids() == {last.id}
        ended = marker()
        assert finished.next_ids() == {ended}


def test_maintenance_reaping_a_lease_on_the_last_attempt_is_notified_and_a_retry_is_not() -> None:
    """JOB_REAP_EXPIRED: a lost lease of a started job on its last attempt is dead
    (notified); on an earlier one it is scheduled again (not); a claim lost before its
    start is given back (queued: not ended either)."""
    last, _ = pgqueue.enqueue("test.noop", None, tenant="acme", max_attempts=1)
    retried, _ = pgqueue.enqueue("test.noop", None, tenant="acme", max_attempts=3)
    unstarted, _ = pgqueue.enqueue("test.noop", None, tenant="acme", max_attempts=1)
    held = claim(3)
    with connection.cursor() as cur:
        started(cur, [j for j in held if j.id != unstarted.id])
    with listening() as finished, connection.cursor() as cur:
        assert store.reap_expired(cur, now=later(3600)) == {
            last.id: "dead",
            retried.id: "scheduled",
            unstarted.id: "queued",
        }
        assert finished.next_ids() == {last.id}
        ended = marker()
        assert finished.next_ids() == {ended}


def test_a_large_batch_is_split_under_the_payload_limit_even_with_the_longest_ids() -> None:
    """1,000 jobs with 19-digit ids (the longest a bigint has) done in one statement: three
    notifications (400, 400, 200 ids), each under PostgreSQL's 8,000-byte payload limit
    (a payload of 8,000 bytes or more makes pg_notify fail, and the worker's turn with
    it), naming every job once."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_sequence_last_value(pg_get_serial_sequence('pgqueue_job', 'id')::regclass)"
        )
        (was,) = cur.fetchone()  # None: no id drawn yet
        cur.execute(
            "SELECT setval(pg_get_serial_sequence('pgqueue_job', 'id')::regclass, %s)",
            [9_000_000_000_000_000_000],
        )
    try:
        made = pgqueue.enqueue_many("test.noop", [None] * 1000, tenant="acme")
        assert all(len(str(i)) == 19 for i in made)
        held = claim(1000)
        with listening() as finished:
            assert len(complete(held)) == 1000
            payloads = finished.next(3)
    finally:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT setval(pg_get_serial_sequence('pgqueue_job', 'id')::regclass, %s, %s)",
                [was or 1, was is not None],
            )
    assert sorted(len(ids(p)) for p in payloads) == [200, 400, 400]
    assert max(len(p.encode()) for p in payloads) < 8000
    named = [i for p in payloads for i in ids(p)]
    assert sorted(named) == sorted(made)
