"""Concurrency: what the row locks in pgqueue's statements guarantee under real races.

Every test here commits its data and races several connections against it (each thread of
``run_threads`` has its own Django connection), so all of them are transactional.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

import pgqueue
from pgqueue import claim_store, store
from pgqueue.conf import pgqueue_settings
from pgqueue.models import FairClock, Job, Status
from tests.conftest import claim, run_threads

THREADS = 8
JOBS = 2_000
TENANTS = ("t0", "t1", "t2", "t3")
CLAIM_BATCH = 5
RACE_ROUNDS = 5

JOB_CLAIM = claim_store.STATEMENTS["JOB_CLAIM"]
#: JOB_CLAIM with its row lock taken out: every claimer may pick the same candidates.
JOB_CLAIM_NO_ROW_LOCK = JOB_CLAIM.replace("FOR UPDATE SKIP LOCKED", "")
#: JOB_CLAIM that waits for locked rows instead of skipping them.
JOB_CLAIM_WAITING = JOB_CLAIM.replace("FOR UPDATE SKIP LOCKED", "FOR UPDATE")

ClaimIds = Callable[[Any, str], list[int]]


def claim_ids(cursor: Any, worker: str) -> list[int]:
    """The real claim: ``store.claim`` (JOB_CLAIM, FOR UPDATE SKIP LOCKED)."""
    jobs = store.claim(cursor, worker=worker, queues=["default"], limit=CLAIM_BATCH)
    return [j.id for j in jobs]


def claim_params(worker: str, limit: int = CLAIM_BATCH) -> dict[str, Any]:
    """The parameters ``store.claim`` binds, for running a variant of JOB_CLAIM directly."""
    return {
        "queues": ["default"],
        "limit": limit,
        "worker": worker,
        "lease": float(pgqueue_settings.LEASE_SECONDS),
        "now": None,
    }


def claim_ids_without_row_lock(cursor: Any, worker: str) -> list[int]:
    """JOB_CLAIM without FOR UPDATE SKIP LOCKED, with store.claim's parameters.

    Without the row lock the UPDATEs of two claimers can meet on the same rows in any
    order, so PostgreSQL may break a deadlock by failing one statement. That is a failure
    of the broken statement, not of the test: nothing was claimed, so try again.
    """
    for _ in range(100):
        try:
            cursor.execute(JOB_CLAIM_NO_ROW_LOCK, claim_params(worker))
        except OperationalError as exc:
            if isinstance(exc.__cause__, psycopg.errors.DeadlockDetected):
                continue
            raise
        return [row[0] for row in cursor.fetchall()]
    raise AssertionError("the claim without a row lock deadlocked 100 times in a row")


def claim_race(claim: ClaimIds) -> tuple[list[int], Counter[int]]:
    """Enqueue JOBS fresh jobs, then let THREADS workers claim with ``claim`` until dry.

    Each worker loops until a claim returns nothing; the jobs are not completed (a
    claimed job is 'running' and can only be claimed again if the claim is broken).
    Returns the new jobs' ids and how many times each id was handed out.
    """
    ids: list[int] = []
    for tenant in TENANTS:
        ids += pgqueue.enqueue_many(
            "test.noop",
            [{"n": n} for n in range(JOBS // len(TENANTS))],
            tenant=tenant,
            # A job handed out to every worker at once must not break the attempts CHECK.
            max_attempts=100,
        )
    assert len(ids) == JOBS

    def worker(i: int) -> list[int]:
        claimed: list[int] = []
        with connection.cursor() as cursor:
            for _ in range(JOBS + 1):  # each claim that returns rows takes >= 1 job
                got = claim(cursor, f"w{i}")
                if not got:
                    return claimed
                claimed.extend(got)
        raise AssertionError(f"worker w{i} never ran dry")

    per_worker = run_threads(THREADS, worker)
    return ids, Counter(job_id for claimed in per_worker for job_id in claimed)


def attempts_of(ids: list[int]) -> dict[int, int]:
    return dict(Job.objects.filter(id__in=ids).values_list("id", "attempts"))


@pytest.mark.django_db(transaction=True)
def test_racing_workers_claim_every_job_exactly_once() -> None:
    """8 workers racing over 2,000 jobs take each job exactly once.

    This proves that JOB_CLAIM's FOR UPDATE SKIP LOCKED row lock makes claims exclusive:
    a row one claimer has picked is invisible to the others until it is 'running'.
    ``test_claim_without_row_lock_hands_out_duplicates`` runs the identical race with the
    lock removed and sees duplicates, so this race is able to catch them.
    """
    ids, counts = claim_race(claim_ids)

    twice = {job_id: n for job_id, n in counts.items() if n > 1}
    assert twice == {}, f"jobs claimed more than once: {dict(list(twice.items())[:10])}"
    assert set(counts) == set(ids)
    assert sum(counts.values()) == JOBS
    attempts = attempts_of(ids)
    assert len(attempts) == JOBS
    assert set(attempts.values()) == {1}
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {Status.RUNNING}


@pytest.mark.django_db(transaction=True)
def test_claim_without_row_lock_hands_out_duplicates() -> None:
    """The same race, with FOR UPDATE SKIP LOCKED removed from JOB_CLAIM, catches duplicates.

    Without the row lock the claimers read the same candidates; each UPDATE waits for the
    other's and then re-applies itself to the row the other has just claimed, so a job is
    handed to two workers (and its attempts count goes up twice). A race may by chance
    show none, so up to RACE_ROUNDS races over fresh jobs are run until one does.
    """
    assert "FOR UPDATE SKIP LOCKED" in JOB_CLAIM
    assert "FOR UPDATE SKIP LOCKED) j" not in JOB_CLAIM_NO_ROW_LOCK

    rounds = []
    for _ in range(RACE_ROUNDS):
        ids, counts = claim_race(claim_ids_without_row_lock)
        twice = [job_id for job_id, n in counts.items() if n > 1]
        attempted_twice = [job_id for job_id, n in attempts_of(ids).items() if n > 1]
        rounds.append((len(twice), len(attempted_twice)))
        if twice or attempted_twice:
            break
    assert any(twice or again for twice, again in rounds), (
        f"{len(rounds)} races without the row lock showed no duplicate claim"
    )
    # Every job was still claimed (the broken claim over-delivers, it does not lose jobs).
    assert set(counts) == set(ids)


@pytest.mark.django_db(transaction=True)
def test_claim_skips_a_row_locked_by_another_connection() -> None:
    """A claim skips a job another transaction has locked instead of waiting for it.

    A second connection holds the head job FOR UPDATE in an open transaction. The claim
    runs under a lock_timeout, so a claim that waited would fail instead of hanging; the
    same claim with SKIP LOCKED taken out does wait and time out, which shows the setup
    really blocks a claim that does not skip.
    """
    ids = pgqueue.enqueue_many("test.noop", [1, 2, 3], tenant="acme")
    head, second, third = ids
    params = connection.settings_dict
    other = psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"] or None,
        password=params["PASSWORD"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
    )
    try:
        # Not autocommit: the lock is held until the rollback below.
        locked = other.execute(
            "SELECT id FROM pgqueue_job WHERE id = %s FOR UPDATE", [head]
        ).fetchall()
        assert locked == [(head,)]

        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")
            jobs = store.claim(cursor, worker="w1", queues=["default"], limit=1)
        assert [j.id for j in jobs] == [second]
        assert Job.objects.get(pk=head).status == Status.QUEUED

        # The control: without SKIP LOCKED the claim queues behind the lock.
        with (
            pytest.raises(OperationalError) as waited,
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute("SET LOCAL lock_timeout = '100ms'")
            cursor.execute(JOB_CLAIM_WAITING, claim_params("w2", limit=1))
        assert isinstance(waited.value.__cause__, psycopg.errors.LockNotAvailable)
    finally:
        other.rollback()
        other.close()

    # Once the lock is gone the head job is claimable again, and it is next.
    assert [j.id for j in claim("w3")] == [head]
    assert [j.id for j in claim("w3")] == [third]


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_of_one_tenant_get_distinct_vtimes() -> None:
    """8 threads enqueueing for the same tenant at once give every job its own vtime.

    This proves that JOB_ENQUEUE's lock on the tenant's fair-clock row (taken by its
    INSERT .. ON CONFLICT DO UPDATE) serialises the tenant's enqueues: without it, two
    enqueuers would read the same clock and hand out the same vtimes. Half the threads
    enqueue one job per call, half in small batches with enqueue_many.
    """
    per_thread = 50

    def enqueuer(i: int) -> list[int]:
        if i % 2 == 0:
            return [
                pgqueue.enqueue("test.noop", {"t": i, "n": n}, tenant="acme").job.id
                for n in range(per_thread)
            ]
        ids: list[int] = []
        for start in range(0, per_thread, 5):
            ids += pgqueue.enqueue_many(
                "test.noop", [{"t": i, "n": n} for n in range(start, start + 5)], tenant="acme"
            )
        return ids

    per_worker = run_threads(THREADS, enqueuer)

    vtime = dict(Job.objects.filter(tenant_id="acme").values_list("id", "vtime"))
    assert len(vtime) == THREADS * per_thread
    assert sorted(vtime) == sorted(i for ids in per_worker for i in ids)
    vtimes = list(vtime.values())
    assert len(set(vtimes)) == len(vtimes), "two jobs of one tenant share a vtime"
    # A flood of one tenant (weight 1) gets vtimes 1, 2, 3, ... with no gap either.
    assert sorted(vtimes) == [float(n) for n in range(1, len(vtimes) + 1)]
    # The tenant's clock stands at its latest job.
    clock = FairClock.objects.get(queue="default", tenant_id="acme", priority=0)
    assert clock.vtime == max(vtimes)
    # And each enqueuer's own jobs keep the order it enqueued them in.
    for ids in per_worker:
        assert [vtime[i] for i in ids] == sorted(vtime[i] for i in ids)


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_with_one_idempotency_key_create_one_job() -> None:
    """10 concurrent enqueues with the same idempotency key create exactly one job.

    One call creates it; the other nine return that job with created=False. The tenant's
    clock is charged for that one job only: an enqueue that loses the race (or finds the
    key already taken) must not leave virtual time charged.
    """
    n = 10

    def enqueuer(i: int) -> tuple[int, bool]:
        job, created = pgqueue.enqueue(
            "test.noop", {"caller": i}, tenant="acme", idempotency_key="same"
        )
        return job.id, created

    results = run_threads(n, enqueuer)

    rows = list(Job.objects.filter(tenant_id="acme", idempotency_key="same"))
    assert len(rows) == 1
    (job,) = rows
    assert Job.objects.filter(tenant_id="acme").count() == 1
    assert [created for _, created in results].count(True) == 1
    assert {job_id for job_id, _ in results} == {job.id}
    clock = FairClock.objects.get(queue="default", tenant_id="acme", priority=0)
    assert clock.vtime == job.vtime == 1.0

    # A late duplicate, which finds the key already committed, leaves the clock alone too.
    again, created = pgqueue.enqueue("test.noop", {}, tenant="acme", idempotency_key="same")
    assert (again.id, created) == (job.id, False)
    clock.refresh_from_db()
    assert clock.vtime == 1.0
